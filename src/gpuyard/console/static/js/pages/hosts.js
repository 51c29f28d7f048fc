// The operator's fleet: each host with capacity bars (GPUs, vCPU, memory, disk: what
// clusters hold of what it has), status, reachability and last heartbeat, and cordon,
// uncordon and drain; then the orphaned engine volumes found on the hosts. Polled
// every 5 s while the tab is visible, with the answers' ETags: an unchanged fleet is
// a 304 and what is shown stays.
import { del, get, post } from "../api.js";
import { age, clear, flash, h } from "../ui.js";
import { poll } from "../poll.js";
import { session } from "../session.js";

const CONFIRM = {
  cordon: "Cordon this host? Nothing new is placed on it; what runs there stays.",
  drain: "Drain this host? Its clusters are stopped, and moved where their volume can go.",
  uncordon: "Uncordon this host? New clusters may be placed on it again.",
};

function sum(gpus) {
  return Object.values(gpus || {}).reduce((a, b) => a + b, 0);
}

// One capacity bar: `held` of `total` (a <meter>, with the numbers as text).
export function capacityBar(label, held, total, unit = "") {
  const shown = (n) => (Number.isInteger(n) ? String(n) : n.toFixed(1));
  return h("div", { class: "cap-row", "data-capacity": label },
    h("span", { class: "cap-label" }, label),
    h("meter", { min: "0", max: String(Math.max(total, 0.0001)), value: String(Math.min(held, total)), high: String(total * 0.9), optimum: "0", "aria-label": `${label} in use` }),
    h("span", { class: "cap-num" }, `${shown(held)} / ${shown(total)}${unit}`));
}

export function render(main) {
  const hostsBox = h("div", { class: "hosts", "data-testid": "hosts" });
  const orphans = h("div", { "data-testid": "orphans" });
  const install = h("p", { class: "muted small" });
  main.append(h("h1", {}, "Hosts"), install, hostsBox, h("section", { class: "card" }, h("h2", {}, "Orphaned volumes"),
    h("p", { class: "muted small" }, "Engine volumes with this installation's label that no cluster owns: kept in quarantine, then deleted."), orphans));
  if (!session.operator) {
    clear(hostsBox).append(h("p", { class: "muted" }, "Hosts are the operator's: sign in with the operator's admin key."));
    return null;
  }
  const writable = true; // an admin-scoped key may change hosts

  async function act(host, action) {
    if (!window.confirm(`${CONFIRM[action]}\n\n${host.name}`)) return;
    try {
      const answer = await post(`/v1/hosts/${host.id}/${action}`);
      if (action === "drain") {
        const d = answer.data.drain;
        const t = d.training_nodes;
        flash(`draining: ${d.stopping.length} stopping, ${d.moving.length} moving, ${d.cannot_move.length} cannot move; ` +
          `training nodes: ${t.moving.length} moving, ${t.cannot_move.length} cannot move`);
      } else {
        flash(`${host.name} ${action}ed`);
      }
    } catch (err) {
      flash(err.message, "error");
    }
    poller.now();
  }

  function hostCard(x) {
    const cap = x.capacity;
    const held = cap.allocated;
    const buttons = writable
      ? [
          x.status === "active" ? h("button", { type: "button", "data-host-action": "cordon", onclick: () => act(x, "cordon") }, "Cordon") : null,
          x.status !== "active" ? h("button", { type: "button", "data-host-action": "uncordon", onclick: () => act(x, "uncordon") }, "Uncordon") : null,
          x.status !== "draining" ? h("button", { type: "button", class: "danger", "data-host-action": "drain", onclick: () => act(x, "drain") }, "Drain") : null,
        ]
      : [];
    return h("section", { class: "card host", "data-host": x.name },
      h("div", { class: "page-head" },
        h("h2", {}, x.name, x.is_local ? h("span", { class: "muted small" }, " (this machine)") : null),
        h("span", {}, h("span", { class: "badge status-" + x.status, "data-host-status": x.status }, x.status), " ",
          h("span", { class: "badge " + (x.healthy ? "status-running" : "status-error") }, x.reachability))),
      h("p", { class: "muted small" },
        `${x.location} · ${x.cloud_type} · ${x.engine_name || "engine"} ${x.engine_version || ""} · heartbeat ${x.last_heartbeat_at ? age(x.last_heartbeat_at) + " ago" : "never"}` +
        (x.missed_heartbeats ? ` · ${x.missed_heartbeats} missed` : "") + (x.heartbeat_error ? ` · ${x.heartbeat_error}` : "")),
      h("div", { class: "capacity" },
        capacityBar("GPUs", sum(held.gpus), sum(cap.total.gpus)),
        capacityBar("vCPU", held.vcpus, cap.total.vcpus),
        capacityBar("Memory", held.memory_gb, cap.total.memory_gb, " GB"),
        capacityBar("Disk", held.disk_gb, cap.total.disk_gb, " GB")),
      Object.keys(cap.total.gpus).length
        ? h("p", { class: "muted small" }, Object.entries(cap.total.gpus).map(([t, n]) => `${t}: ${cap.free.gpus[t] ?? 0} of ${n} free`).join(" · "))
        : null,
      h("p", { class: "small" }, `${x.clusters.length} workload${x.clusters.length === 1 ? "" : "s"}: `,
        x.clusters.slice(0, 20).map((c, i) => [i ? ", " : "", c.kind === "cluster" ? h("a", { href: `#/clusters/${c.id}` }, c.name) : c.name, ` (${c.status})`]),
        x.clusters.length > 20 ? ` and ${x.clusters.length - 20} more` : ""),
      h("div", { class: "actions" }, buttons));
  }

  let orphansEtag = null; // the ETag of the orphans shown, for the next poll's 304
  async function showOrphans() {
    const answer = await get("/v1/orphans", { etag: orphansEtag });
    if (answer.notModified) return;
    const list = answer.data.orphans;
    const live = list.filter((o) => o.status === "quarantined");
    clear(orphans).append(live.length
      ? h("div", { class: "table-wrap" }, h("table", { class: "list" },
          h("thead", {}, h("tr", {}, ["Volume", "Host", "Was cluster", "Found", "Deleted after", ""].map((t) => h("th", { scope: "col" }, t)))),
          h("tbody", {}, live.map((o) => h("tr", {},
            h("td", {}, h("code", {}, o.name)), h("td", {}, o.host || `#${o.host_id}`), h("td", {}, o.cluster_id || "—"),
            h("td", {}, new Date(o.found_at).toLocaleString()), h("td", {}, o.delete_after ? new Date(o.delete_after).toLocaleString() : "kept until deleted"),
            h("td", {}, h("button", { type: "button", class: "link danger", onclick: () => deleteOrphan(o) }, "Delete now")))))))
      : h("p", { class: "muted" }, "None."));
    orphansEtag = answer.etag;
  }

  async function deleteOrphan(o) {
    if (!window.confirm(`Delete volume ${o.name} on ${o.host} now? Its data is gone for good.`)) return;
    try {
      await del(`/v1/orphans/${o.id}`);
    } catch (err) {
      flash(err.message, "error");
    }
    await showOrphans();
  }

  let ticks = 0;
  async function refresh(etag) {
    const answer = await get("/v1/hosts", { etag });
    if (!answer.notModified) {
      const data = answer.data;
      install.textContent = `Installation ${data.installation_id} · ${data.hosts.length} host${data.hosts.length === 1 ? "" : "s"}`;
      clear(hostsBox).append(...data.hosts.map(hostCard));
    }
    // Orphans change rarely (a sweep finds them): every sixth poll is enough.
    if (ticks++ % 6 === 0) await showOrphans();
    return answer;
  }

  const poller = poll(refresh, 5000);
  return () => poller.stop();
}
