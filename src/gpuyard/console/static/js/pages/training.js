// Training clusters (seed 002) of a project at a location: status (polled, paused
// while the tab is hidden), nodes, plan and price. The first page is polled; "Show
// more" follows the list's cursor once.
import { get } from "../api.js";
import { age, clear, h, rate, statusBadge } from "../ui.js";
import { poll } from "../poll.js";
import { session } from "../session.js";
import { loadScopes, parseScope, scopePicker, scopeQuery, trainingPath } from "../training_scope.js";

const PER_PAGE = 100;

export function planLabel(plan) {
  if (!plan) return "—";
  const gpus = plan.gpus_per_node ? `${plan.gpu_type} × ${plan.gpus_per_node}` : "CPU only";
  return `${gpus} · ${plan.cpus_per_node} vCPU · ${plan.memory_gb_per_node} GB per node`;
}

export async function render(main, [query]) {
  const scopes = await loadScopes(parseScope(query));
  const scope = scopes.scope;
  const head = h("div", { class: "page-head" }, h("h1", {}, "Training clusters"));
  main.append(head);
  if (!scope) {
    main.append(h("p", { class: "muted" }, "No location has hosts yet: an operator adds them (gpuyard hosts add)."));
    return null;
  }
  if (session.canWrite) {
    head.append(h("a", { class: "button primary", href: "#/training/new?" + scopeQuery(scope), "data-testid": "new-training" }, "New training cluster"));
  }
  const tbody = h("tbody");
  const count = h("span", { class: "muted" });
  const empty = h("p", { class: "muted", hidden: true }, "No training clusters here.");
  const more = h("button", { type: "button", hidden: true }, "Show more");
  let extra = [];
  let nextCursor = null;

  main.append(
    scopePicker(scopes, (s) => (location.hash = "#/training?" + scopeQuery(s))),
    h("div", { class: "toolbar" }, count),
    h("div", { class: "table-wrap" }, h("table", { class: "list", "data-testid": "training-table" },
      h("thead", {}, h("tr", {}, ["Name", "Status", "Nodes", "Plan", "Rate", "Age"].map((t) => h("th", { scope: "col" }, t)))),
      tbody)),
    empty,
    more,
  );

  function row(c) {
    return h("tr", { "data-training": c.id },
      h("td", {}, h("a", { href: `#/training/${c.id}?` + scopeQuery(scope) }, c.name), h("div", { class: "muted small" }, `#${c.id}`)),
      h("td", {}, statusBadge(c.status)),
      h("td", {}, `1 controller + ${c.no_of_nodes} worker${c.no_of_nodes === 1 ? "" : "s"}`),
      h("td", {}, planLabel(c.plan)),
      h("td", {}, rate(c.price_per_hour)),
      h("td", {}, age(c.created_at)));
  }

  let first = [];
  function show() {
    clear(tbody).append(...[...first, ...extra].map(row));
    empty.hidden = first.length > 0;
    more.hidden = !nextCursor;
  }

  async function refresh(etag) {
    const answer = await get(trainingPath(scope, "", { per_page: String(PER_PAGE) }), { etag });
    if (answer.notModified) return answer; // the first page is as shown
    first = answer.data;
    const p = answer.pagination;
    count.textContent = p ? `${p.total} total` : "";
    if (!extra.length) nextCursor = p ? p.next_cursor : null;
    show();
    return answer;
  }

  more.addEventListener("click", async () => {
    const answer = await get(trainingPath(scope, "", { per_page: String(PER_PAGE), cursor: nextCursor }));
    extra = [...extra, ...answer.data];
    nextCursor = answer.pagination ? answer.pagination.next_cursor : null;
    show();
  });

  const poller = poll(refresh, 5000);
  return () => poller.stop();
}
