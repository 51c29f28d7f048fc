// One cluster: live status and startup steps, the actions the API allows (for a key
// that may change things), start with changes (what changed and the rate before and
// after, from the start answer), connect (proxy buttons, SSH, web terminal), live
// logs, events (the newest), cost, the auto-terminate countdown and snapshots.
import { del, get, post, streamEvents } from "../api.js";
import { clear, copyText, duration, field, flash, gpuLabel, h, money, rate, showError, statusBadge } from "../ui.js";
import { poll } from "../poll.js";
import { session } from "../session.js";
import { openTerminal } from "../terminal.js";
import { newestEvents } from "../events.js";
import { snapshotsPanel } from "../snapshots.js";
import { lineChart } from "../charts.js";

const CONFIRM = {
  terminate: "Terminate this cluster? Its volume is deleted.",
  stop: "Stop this cluster? Its volume is kept (and billed at the stopped rate).",
  restart: "Restart this cluster's container?",
};

// Each action's button in the user's words.
const ACTION_LABEL = {
  start: "Start",
  stop: "Stop",
  restart: "Restart the container",
  terminate: "Terminate (deletes the volume)",
  resume: "Resume",
};

export function render(main, [id]) {
  const cleanups = [];
  let cluster = null;
  const title = h("h1", {}, id);
  const badge = h("span");
  const actions = h("div", { class: "actions", "data-testid": "actions" });
  const progress = h("div", { class: "progress" });
  const facts = h("dl", { class: "facts" });
  const costBox = h("dl", { class: "facts" });
  const countdown = h("p", { class: "muted", "data-testid": "countdown" });
  const connect = h("div", { class: "connect" });
  const startResult = h("div", { "data-testid": "start-result" });
  const termBox = h("div", { class: "term-box" });
  const usage = h("div", { class: "charts", "data-testid": "usage" }, h("p", { class: "muted" }, "loading…"));
  const logs = h("pre", { class: "logs", "data-testid": "logs", tabindex: "0", "aria-label": "Logs" });
  const events = h("ol", { class: "events", "data-testid": "events" });
  const changes = changesForm();
  const eventLog = newestEvents(id);
  const snaps = snapshotsPanel(id, (data) => {
    showStart(data);
    poller.now();
  });

  main.append(
    h("p", {}, h("a", { href: "#/clusters" }, "← Clusters")),
    h("div", { class: "page-head" }, title, badge),
    progress,
    actions,
    startResult,
    changes,
    h("div", { class: "columns" },
      h("section", { class: "card" }, h("h2", {}, "Details"), facts),
      h("section", { class: "card" }, h("h2", {}, "Cost"), costBox, countdown)),
    h("section", { class: "card" }, h("h2", {}, "Utilisation, last hour"), usage),
    h("section", { class: "card" }, h("h2", {}, "Connect"), connect, termBox),
    h("section", { class: "card" }, h("h2", {}, "Logs"), logs),
    snaps.card,
    h("section", { class: "card" }, h("h2", {}, "Events"), h("p", { class: "muted small" }, "Newest first"), events),
  );

  function fact(dl, term, value) {
    dl.append(h("dt", {}, term), h("dd", {}, value));
  }

  async function act(action, button) {
    if (CONFIRM[action] && !window.confirm(CONFIRM[action])) return;
    try {
      if (action === "terminate") await del(`/v1/clusters/${id}`);
      else if (action === "start") showStart((await post(`/v1/clusters/${id}/start`, {})).data);
      else await post(`/v1/clusters/${id}/${action}`);
      flash(`${ACTION_LABEL[action] || action}: requested`);
    } catch (err) {
      showError(actions, err, button);
    }
    poller.now();
  }

  function showStart(data) {
    const c = data.cost;
    const delta = (c.new_hourly_rate ?? 0) - (c.previous_hourly_rate ?? 0);
    const applied = data.configuration_updates_applied || [];
    clear(startResult).append(
      h("div", { class: "card notice" },
        h("strong", {}, "Started. "),
        applied.length ? `Changes applied: ${applied.map((a) => (typeof a === "string" ? a : JSON.stringify(a))).join(", ")}. ` : "No configuration changes. ",
        h("span", { "data-testid": "cost-delta" },
          `Rate ${rate(c.previous_hourly_rate)} → ${rate(c.new_hourly_rate)} (${delta >= 0 ? "+" : "−"}${rate(Math.abs(delta))})`),
        c.rate_change_reason ? ` — ${c.rate_change_reason}` : ""),
    );
  }

  function changesForm() {
    const inp = (name) => h("input", { type: "number", min: name === "gpu_count" ? "0" : "1", "data-field": name, name, id: "s-" + name });
    const cpu = inp("cpu_cores");
    const memory = inp("memory_gb");
    const gpus = inp("gpu_count");
    const image = h("input", { "data-field": "docker_image", name: "docker_image", placeholder: "unchanged" });
    const form = h("form", { class: "card", hidden: true, "data-testid": "start-changes" },
      h("h2", {}, "Start with changes"),
      h("div", { class: "grid" }, field("vCPU", cpu), field("Memory (GB)", memory), field("GPU count", gpus), field("Image", image)),
      h("button", { type: "submit", class: "primary" }, "Start with these changes"),
      h("button", { type: "button", onclick: () => (form.hidden = true) }, "Cancel"));
    form.open = (c) => {
      cpu.value = c.cpu_cores;
      memory.value = c.memory_gb;
      gpus.value = c.gpu_count;
      image.value = "";
      form.hidden = false;
      memory.focus();
    };
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const update = {};
      for (const [el, key, before] of [[cpu, "cpu_cores", cluster.cpu_cores], [memory, "memory_gb", cluster.memory_gb], [gpus, "gpu_count", cluster.gpu_count]]) {
        if (el.value !== "" && Number(el.value) !== before) update[key] = Number(el.value);
      }
      if (image.value.trim()) update.docker_image = image.value.trim();
      const summary = Object.entries(update).map(([k, v]) => `${k}: ${v}`).join(", ") || "no changes";
      if (!window.confirm(`Start with ${summary}?`)) return;
      try {
        const answer = await post(`/v1/clusters/${id}/start`, Object.keys(update).length ? { update_configuration: update } : {});
        form.hidden = true;
        showStart(answer.data);
      } catch (err) {
        const named = err.field ? err.field.replace(/^update_configuration\./, "") : null;
        if (named) err.details = { ...err.details, field: named };
        showError(form, err);
      }
      poller.now();
    });
    return form;
  }

  function renderActions(c) {
    clear(actions);
    if (!session.canWrite) return;
    for (const action of c.actions || []) {
      actions.append(h("button", { type: "button", class: action === "terminate" ? "danger" : "", "data-action": action, onclick: (ev) => act(action, ev.currentTarget) }, ACTION_LABEL[action] || action));
      if (action === "start") {
        actions.append(h("button", { type: "button", "data-action": "start-with-changes", onclick: () => changes.open(c) }, "Start with other resources"));
      }
    }
  }

  async function openPort(port) {
    try {
      if (port.visibility === "public") {
        window.open(port.proxy_url, "_blank", "noopener");
        return;
      }
      const link = (await get(`/v1/clusters/${id}/ports/${port.internal_port}/open`)).data;
      window.open(link.url, "_blank", "noopener");
    } catch (err) {
      flash(err.message, "error");
    }
  }

  function renderConnect(c) {
    clear(connect);
    const ports = (c.network && c.network.ports) || [];
    const buttons = ports.filter((p) => p.protocol === "http" && p.proxy_url);
    if (buttons.length) {
      connect.append(h("div", { class: "actions" }, buttons.map((p) =>
        h("button", { type: "button", "data-port": p.internal_port, onclick: () => openPort(p), disabled: !session.canWrite && p.visibility !== "public" },
          `Open :${p.internal_port} (${p.visibility})`))));
    }
    for (const p of ports.filter((p) => !p.proxy_url)) {
      connect.append(h("p", { class: "muted" }, `${p.protocol} ${p.internal_port} → ${p.address || "not published"}`));
    }
    const ssh = c.network && c.network.ssh_connection;
    if (ssh && ssh.connection_string) {
      const code = h("code", { "data-testid": "ssh-command" }, ssh.connection_string);
      const copy = h("button", { type: "button", onclick: (ev) => copyText(ssh.connection_string, ev.target) }, "Copy");
      connect.append(h("div", { class: "ssh" }, "SSH: ", code, " ", copy));
    }
    if (session.canWrite && c.status === "running" && !termBox.dataset.open) {
      connect.append(h("button", { type: "button", "data-testid": "open-terminal", onclick: () => {
        termBox.dataset.open = "1";
        cleanups.push(openTerminal(clear(termBox), id));
        renderConnect(cluster);
      } }, "Open web terminal"));
    }
  }

  function renderFacts(c) {
    clear(facts);
    fact(facts, "Id", c.id);
    fact(facts, "GPUs", gpuLabel(c));
    fact(facts, "vCPU / memory", `${c.cpu_cores} vCPU · ${c.memory_gb} GB`);
    fact(facts, "Disk / volume", `${c.container_disk_gb} GB · ${c.volume_gb} GB at ${c.volume_mount_path}`);
    fact(facts, "Image", c.docker_image);
    if (c.docker_args) fact(facts, "Command", c.docker_args);
    fact(facts, "Host", c.host ? `${c.host.name} (${c.host.location}), ${c.host_status}` : "—");
    if (c.interruptible) fact(facts, "Spot bid", money(c.bid_per_gpu) + " per GPU-hour");
    if (c.error_message) fact(facts, "Error", c.error_message);
    // The API masks secret values (names with TOKEN, PASSWORD, KEY ... or marked secret).
    const env = Object.entries(c.env || {});
    fact(facts, "Environment", env.length
      ? h("ul", { class: "plain", "data-testid": "env" }, env.map(([k, v]) =>
        h("li", {}, h("code", {}, k), " = ", h("code", { class: v === "********" ? "masked" : "" }, v === "********" ? "•••••••• (secret)" : v))))
      : "none");
    const ports = (c.network && c.network.ports) || [];
    fact(facts, "Ports", ports.length
      ? h("ul", { class: "plain", "data-testid": "ports" }, ports.map((p) => {
        const url = p.proxy_url || (p.address ? `${p.protocol}://${p.address}` : null);
        return h("li", { "data-port-row": p.internal_port }, `${p.internal_port}/${p.protocol} · ${p.visibility || "private"} · `,
          url ? h("code", { class: "url" }, url) : "not published yet");
      }))
      : "none");
    clear(costBox);
    fact(costBox, "Rate now", rate(c.cost.hourly_rate));
    fact(costBox, "This run", money(c.cost.accrued_usd.current_run, 4));
    fact(costBox, "Lifetime", money(c.cost.accrued_usd.lifetime, 4));
  }

  function renderProgress(c) {
    clear(progress);
    const p = c.startup_progress;
    if (!p) return;
    progress.append(
      h("label", {}, `${p.current_step} (${p.steps_completed}/${p.total_steps})`,
        h("progress", { max: "100", value: String(p.percentage), "data-testid": "startup-progress" }, `${p.percentage}%`)),
    );
  }

  function tickCountdown() {
    const at = cluster && cluster.auto_terminate;
    if (!at || !at.next_deadline_at) {
      countdown.textContent = at && at.enabled ? "Auto-terminate: on, no deadline yet" : "Auto-terminate: off";
      return;
    }
    const left = (Date.parse(at.next_deadline_at) - Date.now()) / 1000;
    countdown.textContent = `Auto-${at.next_action || "stop"} (${at.next_rule}) in ${duration(left)}`;
  }

  async function refresh(etag) {
    const answer = await get(`/v1/clusters/${id}`, { etag });
    // A 304 (answer.notModified): the cluster is as shown. Snapshots and events are
    // read on all the same: they change without the cluster changing.
    if (!answer.notModified) {
      cluster = answer.data;
      title.textContent = cluster.name;
      clear(badge).append(statusBadge(cluster.status));
      renderProgress(cluster);
      renderActions(cluster);
      renderFacts(cluster);
      renderConnect(cluster);
      tickCountdown();
    }
    await snaps.update(cluster);
    const newest = await eventLog.read();
    clear(events).append(...[...newest].reverse().map((e) =>
      h("li", { "data-event": e.id }, h("time", { datetime: e.at }, new Date(e.at).toLocaleString()), " ", e.message || `${e.from_status} → ${e.to_status}`)));
    return answer;
  }

  // The utilisation charts: the API's samples of the last hour (taken every 30 s).
  async function refreshUsage() {
    try {
      const m = (await get(`/v1/clusters/${id}/metrics?window=1h`)).data;
      const end = Date.now();
      const start = end - m.window_s * 1000;
      const series = (key) => m.samples.map((s) => ({ t: Date.parse(s.at), v: s[key] }));
      clear(usage).append(
        lineChart("GPU", series("gpu_percent"), start, end, m.samples.length ? "no GPU data" : "no data yet"),
        lineChart("CPU", series("cpu_percent"), start, end),
        lineChart("Memory", series("memory_percent"), start, end));
    } catch (err) {
      clear(usage).append(h("p", { class: "muted" }, `utilisation unavailable: ${err.message}`));
    }
  }
  refreshUsage();
  const usageTimer = setInterval(refreshUsage, 30_000);
  cleanups.push(() => clearInterval(usageTimer));

  const poller = poll(refresh, 3000);
  snaps.refresh().catch((err) => flash(`snapshots: ${err.message}`, "error"));
  const clock = setInterval(tickCountdown, 1000);
  const follow = new AbortController();
  streamEvents(`/v1/clusters/${id}/logs?follow=true&tail=200`, (ev) => {
    if (ev.event !== "message") return;
    try {
      const entry = JSON.parse(ev.data);
      logs.append(h("span", { class: "log-" + entry.source }, entry.line + "\n"));
      if (logs.childNodes.length > 2000) logs.firstChild.remove();
      logs.scrollTop = logs.scrollHeight;
    } catch {
      /* a malformed event is skipped */
    }
  }, follow.signal).catch((err) => {
    if (err.name !== "AbortError") logs.append(h("span", { class: "log-system" }, `(logs unavailable: ${err.message})\n`));
  });

  return () => {
    poller.stop();
    clearInterval(clock);
    follow.abort();
    for (const fn of cleanups) fn();
  };
}
