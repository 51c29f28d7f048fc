// The web terminal on GET /v1/clusters/{id}/terminal (WebSocket): xterm.js (vendored
// at build time, see `make console-assets`) draws the shell, so colours, cursor
// movement and full-screen programs (top, vim) work. Binary frames carry the shell's
// bytes both ways; text frames are JSON control: this page sends
// {"type": "resize", "rows", "cols"} whenever the terminal's box changes size (the
// fit addon measures it), the server answers {"type": "exit", "code"} at the end.
// The CSRF token travels as a subprotocol (a browser cannot set headers on a
// WebSocket); the session cookie authenticates.
import { csrfToken } from "./api.js";
import { h } from "./ui.js";

export function openTerminal(container, clusterId) {
  const screen = h("div", { class: "terminal xterm-host", "data-testid": "terminal-output", "aria-label": "Terminal" });
  const state = h("small", { class: "muted", "data-testid": "terminal-state" }, "connecting…");
  container.append(screen, state);
  if (!window.Terminal || !window.FitAddon) {
    state.textContent = "the terminal's scripts are missing (run make console-assets)";
    return () => {};
  }
  const term = new window.Terminal({
    cursorBlink: true,
    convertEol: false,
    fontFamily: "ui-monospace, SFMono-Regular, Menlo, monospace",
    fontSize: 14,
    scrollback: 5000,
    theme: { background: "#0c0e12", foreground: "#d7dae0" },
  });
  const fit = new window.FitAddon.FitAddon();
  term.loadAddon(fit);
  term.open(screen);
  fit.fit();

  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  const url = `${scheme}//${location.host}/v1/clusters/${encodeURIComponent(clusterId)}/terminal?rows=${term.rows}&cols=${term.cols}`;
  const ws = new WebSocket(url, ["gpuyard.terminal.v1", "gpuyard.csrf." + csrfToken()]);
  ws.binaryType = "arraybuffer";
  const encoder = new TextEncoder();

  const sendSize = () => {
    if (ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ type: "resize", rows: term.rows, cols: term.cols }));
  };
  term.onResize(sendSize);
  term.onData((data) => {
    if (ws.readyState === WebSocket.OPEN) ws.send(encoder.encode(data));
  });
  // The box follows the window (and the page's layout): refit, which resizes and so
  // tells the shell.
  const observer = new ResizeObserver(() => {
    try {
      fit.fit();
    } catch {
      /* a box not laid out (hidden) has no size to fit */
    }
  });
  observer.observe(screen);

  ws.addEventListener("open", () => {
    state.textContent = "connected";
    sendSize();
    term.focus();
  });
  ws.addEventListener("message", (ev) => {
    if (typeof ev.data === "string") {
      try {
        const msg = JSON.parse(ev.data);
        if (msg.type === "exit") state.textContent = `shell exited (${msg.code ?? "?"})`;
      } catch {
        /* control messages we do not know are ignored */
      }
      return;
    }
    term.write(new Uint8Array(ev.data));
  });
  ws.addEventListener("close", (ev) => {
    state.textContent = "closed" + (ev.reason ? ": " + ev.reason : "");
    term.options.disableStdin = true;
  });
  return () => {
    observer.disconnect();
    ws.close();
    term.dispose();
  };
}
