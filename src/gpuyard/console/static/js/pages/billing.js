// Spend of the acting account for a period, grouped by day, cluster or GPU type:
// a bar chart (plain elements) and a table, with CSV download.
import { get } from "../api.js";
import { clear, h, money } from "../ui.js";

function monthStart() {
  const d = new Date();
  return new Date(Date.UTC(d.getUTCFullYear(), d.getUTCMonth(), 1)).toISOString().slice(0, 10);
}

export async function render(main) {
  const from = h("input", { type: "date", value: monthStart(), "data-field": "from", "aria-label": "From" });
  const to = h("input", { type: "date", "data-field": "to", "aria-label": "To (exclusive)" });
  const group = h("select", { "aria-label": "Group by" }, ["day", "cluster", "gpu_type"].map((g) => h("option", { value: g }, g)));
  const chart = h("div", { class: "chart", role: "img", "aria-label": "Spend chart" });
  const tbody = h("tbody");
  const total = h("p", { class: "total" });
  const csv = h("a", { class: "button", download: "gpuyard-billing.csv" }, "Download CSV");
  const error = h("p", { class: "field-error", hidden: true });
  main.append(h("h1", {}, "Billing"), h("div", { class: "toolbar" }, from, to, group, csv), error, total, chart,
    h("div", { class: "table-wrap" }, h("table", { class: "list" },
      h("thead", {}, h("tr", {}, ["Item", "GPU hours", "Spend"].map((t) => h("th", { scope: "col" }, t)))), tbody)));

  async function refresh() {
    const q = new URLSearchParams({ group_by: group.value });
    if (from.value) q.set("from", from.value + "T00:00:00Z");
    if (to.value) q.set("to", to.value + "T00:00:00Z");
    try {
      const bill = (await get("/v1/billing?" + q)).data;
      error.hidden = true;
      total.textContent = `Total ${money(bill.total_usd)} from ${bill.from} to ${bill.to}`;
      const peak = Math.max(0.000001, ...bill.items.map((i) => i.total_usd));
      clear(chart).append(...bill.items.map((i) => {
        const bar = h("span", { class: "bar" });
        bar.style.width = `${(100 * i.total_usd) / peak}%`;
        return h("div", { class: "bar-row" }, h("span", { class: "bar-label" }, i.name || i.key), bar, h("span", {}, money(i.total_usd)));
      }));
      clear(tbody).append(...bill.items.map((i) => h("tr", {}, h("td", {}, i.name || i.key), h("td", {}, i.gpu_hours.toFixed(2)), h("td", {}, money(i.total_usd, 4)))));
      const rows = [["key", "name", "gpu_hours", "total_usd"], ...bill.items.map((i) => [i.key, i.name, i.gpu_hours, i.total_usd])];
      const text = rows.map((r) => r.map((v) => `"${String(v ?? "").replace(/"/g, '""')}"`).join(",")).join("\n");
      if (csv.href) URL.revokeObjectURL(csv.href);
      csv.href = URL.createObjectURL(new Blob([text], { type: "text/csv" }));
    } catch (err) {
      error.hidden = false;
      error.textContent = (err.field ? err.field + ": " : "") + err.message;
    }
  }
  for (const el of [from, to, group]) el.addEventListener("change", refresh);
  await refresh();
}
