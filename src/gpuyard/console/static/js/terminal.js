// A minimal web terminal on GET /v1/clusters/{id}/terminal (WebSocket): binary frames
// carry the shell's bytes, text frames JSON control. Output goes to a <pre> with ANSI
// escapes stripped and carriage returns / backspaces applied; input is a line field
// (Enter sends the line). The CSRF token travels as a subprotocol (a browser cannot
// set headers on a WebSocket); the session cookie authenticates.
import { csrfToken } from "./api.js";
import { h } from "./ui.js";

const ANSI = /\x1b\[[0-9;?]*[ -\/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]/g;
const MAX_CHARS = 200_000;

export function openTerminal(container, clusterId) {
  const screen = h("pre", { class: "terminal", "data-testid": "terminal-output", tabindex: "0", "aria-label": "Terminal output" });
  const input = h("input", { class: "terminal-input", "data-testid": "terminal-input", "aria-label": "Terminal input", autocomplete: "off", spellcheck: "false", placeholder: "type a command, Enter to send" });
  const state = h("small", { class: "muted" }, "connecting…");
  container.append(screen, input, state);

  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  const url = `${scheme}//${location.host}/v1/clusters/${encodeURIComponent(clusterId)}/terminal?rows=24&cols=100`;
  const ws = new WebSocket(url, ["gpuyard.terminal.v1", "gpuyard.csrf." + csrfToken()]);
  ws.binaryType = "arraybuffer";
  const decoder = new TextDecoder();
  const encoder = new TextEncoder();
  let text = "";

  function write(chunk) {
    for (const ch of chunk.replace(ANSI, "")) {
      if (ch === "\r") continue;
      if (ch === "\b") text = text.slice(0, -1);
      else if (ch !== "\x07") text += ch;
    }
    if (text.length > MAX_CHARS) text = text.slice(-MAX_CHARS);
    screen.textContent = text;
    screen.scrollTop = screen.scrollHeight;
  }

  ws.addEventListener("open", () => {
    state.textContent = "connected";
    input.focus();
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
    write(decoder.decode(new Uint8Array(ev.data), { stream: true }));
  });
  ws.addEventListener("close", (ev) => {
    state.textContent = "closed" + (ev.reason ? ": " + ev.reason : "");
    input.disabled = true;
  });
  input.addEventListener("keydown", (ev) => {
    if (ev.key === "Enter") {
      ev.preventDefault();
      if (ws.readyState === WebSocket.OPEN) ws.send(encoder.encode(input.value + "\n"));
      input.value = "";
    } else if (ev.key === "c" && ev.ctrlKey) {
      ev.preventDefault();
      if (ws.readyState === WebSocket.OPEN) ws.send(encoder.encode("\x03"));
    }
  });
  return () => ws.close();
}
