// The operator's accounts: every account of the installation, a page at a time
// (oldest first): status, billing mode, members and age. Anybody else sees the
// accounts they belong to (the API decides).
import { get } from "../api.js";
import { age, clear, h } from "../ui.js";

const PER_PAGE = 50;

export async function render(main) {
  const tbody = h("tbody");
  const where = h("span", { class: "muted" });
  const prev = h("button", { type: "button" }, "Previous");
  const next = h("button", { type: "button" }, "Next");
  let page = 1;
  main.append(h("h1", {}, "Accounts"),
    h("div", { class: "table-wrap" }, h("table", { class: "list", "data-testid": "accounts" },
      h("thead", {}, h("tr", {}, ["Account", "Status", "Billing", "Members", "Age"].map((t) => h("th", { scope: "col" }, t)))), tbody)),
    h("div", { class: "toolbar" }, prev, where, next));

  async function show() {
    const data = (await get(`/v1/accounts?page=${page}&per_page=${PER_PAGE}`)).data;
    clear(tbody).append(...data.accounts.map((a) => h("tr", { "data-account": a.id },
      h("td", {}, a.name, h("div", { class: "muted small" }, `#${a.id}`)),
      h("td", {}, h("span", { class: "badge status-" + (a.status === "active" ? "running" : "error") }, a.status), a.status_reason ? ` ${a.status_reason}` : ""),
      h("td", {}, a.billing_mode),
      h("td", {}, String(a.member_count)),
      h("td", {}, age(a.created_at)))));
    const pages = Math.max(1, Math.ceil(data.total / PER_PAGE));
    where.textContent = `page ${page} of ${pages} · ${data.total} accounts`;
    prev.disabled = page <= 1;
    next.disabled = page >= pages;
  }
  prev.addEventListener("click", () => {
    page -= 1;
    show();
  });
  next.addEventListener("click", () => {
    page += 1;
    show();
  });
  await show();
  return null;
}
