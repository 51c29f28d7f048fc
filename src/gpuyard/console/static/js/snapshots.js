// The snapshots panel of a cluster's page: take one (name), list the cluster's
// (newest first), restore one into the stopped cluster (its start's
// `restore_from_snapshot`) and clone one into a new cluster (the create form with
// `snapshot_id`). The list is read when the panel opens, after each change, and on
// the page's poll only while a snapshot is being taken.
import { del, get, post } from "./api.js";
import { clear, field, flash, h, showError, statusBadge } from "./ui.js";
import { session } from "./session.js";

function size(bytes) {
  if (bytes === null || bytes === undefined) return "—";
  const units = ["B", "KB", "MB", "GB", "TB"];
  let n = bytes;
  let i = 0;
  while (n >= 1024 && i < units.length - 1) {
    n /= 1024;
    i += 1;
  }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

// `onStarted(startAnswer)`: the page shows the start's answer (what changed, the rate).
export function snapshotsPanel(clusterId, onStarted) {
  let cluster = null;
  let snapshots = [];
  const tbody = h("tbody");
  const empty = h("p", { class: "muted" }, "No snapshots of this cluster.");
  const name = h("input", { name: "name", "data-field": "name", placeholder: "optional", "data-testid": "snapshot-name" });
  const form = h("form", { class: "inline-form", "data-testid": "take-snapshot" },
    field("Snapshot name", name),
    h("button", { type: "submit" }, "Take snapshot"));
  const card = h("section", { class: "card", "data-testid": "snapshots" },
    h("h2", {}, "Snapshots"),
    session.canWrite ? form : null,
    h("p", { class: "muted small" }, "Taken from a running cluster it is crash-consistent; restore needs the cluster stopped."),
    h("div", { class: "table-wrap" }, h("table", { class: "list" },
      h("thead", {}, h("tr", {}, ["Name", "Status", "Consistency", "Size", "Taken", ""].map((t) => h("th", { scope: "col" }, t)))),
      tbody)),
    empty);

  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    try {
      const body = name.value.trim() ? { name: name.value.trim() } : {};
      await post(`/v1/clusters/${clusterId}/snapshots`, body);
      name.value = "";
      flash("snapshot requested");
    } catch (err) {
      showError(form, err);
    }
    await refresh();
  });

  async function restore(s) {
    if (!window.confirm(`Restore ${s.name || s.id} into this cluster and start it? The volume's data becomes the snapshot's.`)) return;
    try {
      onStarted((await post(`/v1/clusters/${clusterId}/start`, { restore_from_snapshot: s.id })).data);
    } catch (err) {
      flash(err.message, "error");
    }
  }

  async function remove(s) {
    if (!window.confirm(`Delete snapshot ${s.name || s.id}?`)) return;
    try {
      await del(`/v1/snapshots/${s.id}`);
      flash("snapshot deleted");
    } catch (err) {
      flash(err.message, "error");
    }
    await refresh();
  }

  function row(s) {
    const ready = s.status === "ready";
    const buttons = session.canWrite
      ? [
          h("button", { type: "button", "data-snapshot-action": "restore", disabled: !ready || !cluster || cluster.status !== "stopped",
            title: "Restore needs a ready snapshot and the cluster stopped", onclick: () => restore(s) }, "Restore"),
          ready ? h("a", { class: "button", "data-snapshot-action": "clone", href: `#/clusters/new/clone/${encodeURIComponent(s.id)}` }, "Clone") : null,
          h("button", { type: "button", class: "link", "data-snapshot-action": "delete", disabled: s.status === "creating", onclick: () => remove(s) }, "Delete"),
        ]
      : [];
    const progress = s.status === "creating" && s.progress ? ` (${size(s.progress.bytes_done)} read)` : "";
    return h("tr", { "data-snapshot": s.id },
      h("td", {}, s.name || "—", h("div", { class: "muted small" }, s.id)),
      h("td", {}, statusBadge(s.status), progress, s.error ? h("div", { class: "field-error small" }, s.error) : null),
      h("td", {}, s.consistency === "crash_consistent" ? "crash-consistent" : "stopped"),
      h("td", {}, size(s.size_bytes)),
      h("td", {}, s.created_at ? new Date(s.created_at).toLocaleString() : "—"),
      h("td", { class: "row-actions" }, buttons));
  }

  function render() {
    clear(tbody).append(...snapshots.map(row));
    empty.hidden = snapshots.length > 0;
  }

  async function refresh() {
    const q = new URLSearchParams({ cluster_id: clusterId, per_page: "50" });
    snapshots = (await get("/v1/snapshots?" + q)).data.snapshots;
    render();
  }

  return {
    card,
    refresh,
    // The page's poll: the cluster as read now; the list again only while one is
    // being taken (its progress and outcome), else just the buttons' states.
    async update(c) {
      const statusChanged = !cluster || cluster.status !== c.status;
      cluster = c;
      if (snapshots.some((s) => s.status === "creating")) await refresh();
      else if (statusChanged) render();
    },
  };
}
