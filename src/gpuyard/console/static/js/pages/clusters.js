// The clusters list: live status (polled, paused while the tab is hidden), search
// and status filter (done by the API), and bulk stop / terminate with confirmation.
import { del, get, post } from "../api.js";
import { age, clear, flash, gpuLabel, h, money, rate, statusBadge } from "../ui.js";
import { poll } from "../poll.js";
import { session } from "../session.js";

const STATUSES = ["", "pending", "starting", "running", "stopping", "stopped", "error", "terminated"];

export function render(main) {
  const selected = new Set();
  const search = h("input", { type: "search", placeholder: "Search name or id", "aria-label": "Search clusters", "data-testid": "search" });
  const status = h("select", { "aria-label": "Status" }, STATUSES.map((s) => h("option", { value: s }, s || "all live")));
  const tbody = h("tbody");
  const empty = h("p", { class: "muted", hidden: true }, "No clusters.");
  const count = h("span", { class: "muted" });
  const bulk = h(
    "div",
    { class: "bulk", hidden: true },
    h("button", { type: "button", onclick: () => bulkAct("stop") }, "Stop selected"),
    h("button", { type: "button", class: "danger", onclick: () => bulkAct("terminate") }, "Terminate selected"),
  );

  main.append(
    h(
      "div",
      { class: "page-head" },
      h("h1", {}, "Clusters"),
      session.canWrite ? h("a", { class: "button primary", href: "#/clusters/new", "data-testid": "new-cluster" }, "New cluster") : null,
    ),
    h("div", { class: "toolbar" }, search, status, count, session.canWrite ? bulk : null),
    h(
      "div",
      { class: "table-wrap" },
      h(
        "table",
        { class: "list", "data-testid": "cluster-table" },
        h(
          "thead",
          {},
          h("tr", {}, session.canWrite ? h("th", { scope: "col" }, h("span", { class: "sr-only" }, "Select")) : null,
            ["Name", "Status", "GPUs", "Host / location", "Rate", "Accrued", "Age"].map((t) => h("th", { scope: "col" }, t))),
        ),
        tbody,
      ),
    ),
    empty,
  );

  function row(c) {
    const box = h("input", {
      type: "checkbox",
      "aria-label": "Select " + c.name,
      checked: selected.has(c.id),
      onchange: (ev) => {
        if (ev.target.checked) selected.add(c.id);
        else selected.delete(c.id);
        bulk.hidden = selected.size === 0;
      },
    });
    return h(
      "tr",
      { "data-cluster": c.id },
      session.canWrite ? h("td", {}, box) : null,
      h("td", {}, h("a", { href: "#/clusters/" + c.id }, c.name), h("div", { class: "muted small" }, c.id)),
      h("td", {}, statusBadge(c.status)),
      h("td", {}, gpuLabel(c)),
      h("td", {}, c.host ? `${c.host.name} · ${c.host.location}` : "—"),
      h("td", {}, rate(c.cost.hourly_rate)),
      h("td", {}, money(c.cost.accrued_usd.lifetime)),
      h("td", {}, age(c.created_at)),
    );
  }

  function query() {
    const q = new URLSearchParams({ per_page: "100" });
    if (search.value.trim()) q.set("search", search.value.trim());
    if (status.value) q.set("status", status.value);
    return "/v1/clusters?" + q;
  }

  async function refresh(etag) {
    const answer = await get(query(), { etag });
    if (answer.notModified) return answer;
    const { clusters, pagination } = answer.data;
    clear(tbody).append(...clusters.map(row));
    empty.hidden = clusters.length > 0;
    count.textContent = pagination && pagination.total !== undefined ? `${pagination.total} total` : "";
    return answer;
  }

  async function bulkAct(action) {
    const ids = [...selected];
    const verb = action === "stop" ? "Stop" : "Terminate (deletes the volume)";
    if (!window.confirm(`${verb} ${ids.length} cluster(s)?\n${ids.join("\n")}`)) return;
    const results = await Promise.allSettled(
      ids.map((id) => (action === "stop" ? post(`/v1/clusters/${id}/stop`) : del(`/v1/clusters/${id}`))),
    );
    const failed = results.filter((r) => r.status === "rejected");
    selected.clear();
    bulk.hidden = true;
    flash(failed.length ? `${failed.length} failed: ${failed[0].reason.message}` : `${action} requested`, failed.length ? "error" : "info");
    poller.now();
  }

  let debounce = null;
  search.addEventListener("input", () => {
    clearTimeout(debounce);
    debounce = setTimeout(() => poller.now(), 300);
  });
  status.addEventListener("change", () => poller.now());
  const poller = poll(refresh, 4000);
  return () => poller.stop();
}
