// The acting account: its members and their roles, invitations (the token shown
// once), quotas with their use, the budget or prepaid balance with the spend rate,
// and audit events. Each part shows only to a role that may read it, and its
// buttons only to one that may change it (docs/roles.md); the API decides anyway.
import { del, get, patch, post } from "../api.js";
import { clear, clearErrors, copyText, field, flash, h, money, rate, showError } from "../ui.js";
import { session } from "../session.js";

const ROLES = ["owner", "admin", "member", "billing", "viewer"];
const QUOTAS = [["gpus", "GPUs"], ["vcpus", "vCPUs"], ["volume_gb", "Volume GB"], ["snapshot_gb", "Snapshot GB"], ["running_clusters", "Running clusters"]];
const AUDIT_PAGE = 50;

function card(title, testid, ...children) {
  return h("section", { class: "card", "data-testid": testid }, h("h2", {}, title), ...children);
}

function table(headers, rows) {
  return h("div", { class: "table-wrap" }, h("table", { class: "list" },
    h("thead", {}, h("tr", {}, headers.map((t) => h("th", { scope: "col" }, t)))), h("tbody", {}, rows)));
}

// A bar of `used` against `limit` (none: unlimited, no bar).
export function usageBar(used, limit) {
  if (limit === null || limit === undefined) return h("span", {}, `${used} (no limit)`);
  const pct = limit > 0 ? Math.min(100, (100 * used) / limit) : 100;
  return h("span", { class: "usage" },
    h("meter", { min: "0", max: String(limit), value: String(Math.min(used, limit)), high: String(limit * 0.9), optimum: "0" }, `${Math.round(pct)}%`),
    ` ${used} / ${limit}`);
}

export async function render(main) {
  const accountId = session.accountId;
  const base = `/v1/accounts/${accountId}`;
  const manage = session.mayChange("manage_members");
  const account = (await get(base)).data;
  main.append(h("h1", {}, `Account: ${account.name}`),
    h("p", { class: "muted" }, `#${account.id} · ${account.status}${account.status_reason ? ` (${account.status_reason})` : ""} · ${account.billing_mode} · you are ${session.role || "the operator"}`));

  // Members: everyone sees them; owners and admins change roles and remove.
  const members = h("div");
  main.append(card("Members", "members", members));
  async function showMembers() {
    const list = (await get(`${base}/members`)).data.members;
    const myId = session.me.acting.member_id;
    clear(members).append(table(["E-mail", "Name", "Role", "Projects", "Since", ""], list.map((m) => {
      const role = manage && m.id !== myId
        ? h("select", { "aria-label": `Role of ${m.email}`, "data-member-role": m.email, onchange: (ev) => changeRole(m, ev.target) },
            ROLES.map((r) => h("option", { value: r, selected: r === m.role }, r)))
        : m.role;
      return h("tr", { "data-member": m.email },
        h("td", {}, m.email), h("td", {}, m.name || "—"), h("td", {}, role),
        h("td", {}, m.project_ids.length ? m.project_ids.join(", ") : "all"),
        h("td", {}, m.created_at ? new Date(m.created_at).toLocaleDateString() : "—"),
        h("td", {}, manage && m.id !== myId ? h("button", { type: "button", class: "link danger", onclick: () => removeMember(m) }, "Remove") : null));
    })));
  }
  async function changeRole(m, select) {
    if (!window.confirm(`Make ${m.email} ${select.value}?`)) {
      select.value = m.role;
      return;
    }
    try {
      await patch(`${base}/members/${m.id}`, { role: select.value });
      flash(`${m.email} is now ${select.value}`);
    } catch (err) {
      flash(err.message, "error");
    }
    await showMembers();
  }
  async function removeMember(m) {
    if (!window.confirm(`Remove ${m.email} from the account? Their keys for it are revoked.`)) return;
    try {
      await del(`${base}/members/${m.id}`);
      flash(`${m.email} removed`);
    } catch (err) {
      flash(err.message, "error");
    }
    await showMembers();
  }
  await showMembers();

  // Invitations: owners and admins.
  if (manage) {
    const list = h("div");
    const shown = h("div", { "data-testid": "invitation-token" });
    const email = h("input", { type: "email", name: "email", "data-field": "email", required: true, placeholder: "someone@example.com", id: "inv-email" });
    const role = h("select", { name: "role", "data-field": "role", id: "inv-role" },
      ROLES.filter((r) => r !== "owner" || session.role === "owner" || session.operator).map((r) => h("option", { value: r, selected: r === "member" }, r)));
    const form = h("form", { class: "inline-form", "data-testid": "invite" },
      h("div", { class: "grid" }, field("E-mail", email), field("Role", role)),
      h("button", { type: "submit", class: "primary" }, "Invite"));
    main.append(card("Invitations", "invitations", form, shown, list));
    const showInvitations = async () => {
      const rows = (await get(`${base}/invitations`)).data.invitations;
      clear(list).append(rows.length ? table(["E-mail", "Role", "Status", "Expires", ""], rows.map((i) => h("tr", { "data-invitation": i.email },
        h("td", {}, i.email), h("td", {}, i.role), h("td", {}, i.status),
        h("td", {}, i.expires_at ? new Date(i.expires_at).toLocaleString() : "—"),
        h("td", {}, i.status === "pending" ? h("button", { type: "button", class: "link danger", onclick: () => revoke(i) }, "Revoke") : null))))
        : h("p", { class: "muted" }, "No invitations."));
    };
    const revoke = async (i) => {
      if (!window.confirm(`Revoke the invitation of ${i.email}?`)) return;
      try {
        await del(`${base}/invitations/${i.id}`);
      } catch (err) {
        flash(err.message, "error");
      }
      await showInvitations();
    };
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      try {
        const made = (await post(`${base}/invitations`, { email: email.value.trim(), role: role.value })).data;
        email.value = "";
        clear(shown).append(h("div", { class: "card notice" },
          h("p", {}, h("strong", {}, `Send this token to ${made.invitation.email}: it is not shown again. `),
            "They accept it with POST /v1/invitations/{token}/accept (or gpuyard invitations accept)."),
          h("code", { class: "secret" }, made.token), " ",
          h("button", { type: "button", onclick: (e) => copyText(made.token, e.target) }, "Copy"),
          h("button", { type: "button", class: "link", onclick: () => clear(shown) }, "Done")));
        await showInvitations();
      } catch (err) {
        showError(form, err);
      }
    });
    await showInvitations();
  }

  // Quotas and their use: every role sees them.
  const quotas = (await get(`${base}/quotas`)).data;
  const quotaRows = (label, q) => h("tr", {}, h("th", { scope: "row" }, label),
    QUOTAS.map(([key]) => h("td", {}, usageBar(q.usage[key], q.limits[key]))));
  main.append(card("Quotas", "quotas", table(["", ...QUOTAS.map(([, l]) => l)],
    [quotaRows("Account", quotas.account), ...quotas.projects.map((p) => quotaRows(`Project ${p.name}`, p))])));

  // Budget or balance, and the spend rate: owners, admins, billing.
  if (session.may("read_billing")) {
    const b = (await get(`${base}/budget`)).data;
    const facts = h("dl", { class: "facts" });
    const fact = (t, v) => facts.append(h("dt", {}, t), h("dd", {}, v));
    fact("Billing", b.billing_mode);
    fact("Spend rate", rate(b.spend_rate_per_hour));
    fact("Spent this month", money(b.spent_this_month));
    if (b.monthly_budget !== null) fact("Monthly budget", h("span", {}, usageBar(Number(b.spent_this_month.toFixed(2)), b.monthly_budget), ` (alert at ${b.alert_percent}%)`));
    if (b.balance !== null) fact("Balance", money(b.balance));
    if (b.exhausts_at) fact("Runs out", new Date(b.exhausts_at).toLocaleString());
    if (b.exhausted) fact("Exhausted", b.exhausted_at ? new Date(b.exhausted_at).toLocaleString() : "yes");
    main.append(card(b.billing_mode === "prepaid" ? "Balance" : "Budget", "budget", facts, b.alert ? h("p", { class: "field-error" }, "Alert: the budget's threshold is reached.") : null));
  }

  // Audit events, newest first: owners and admins; filtered by who, what and when
  // (the API's own filters: an e-mail or user id, an action or prefix like key.*).
  if (session.may("read_audit")) {
    const tbody = h("tbody");
    const older = h("button", { type: "button", hidden: true }, "Older");
    const who = h("input", { type: "search", "data-field": "actor", placeholder: "who (e-mail)", "aria-label": "Who" });
    const what = h("input", { type: "search", "data-field": "action", placeholder: "action (key.*)", "aria-label": "Action" });
    const since = h("input", { type: "date", "data-field": "from", "aria-label": "From" });
    const until = h("input", { type: "date", "data-field": "to", "aria-label": "To (exclusive)" });
    const filters = h("form", { class: "toolbar", "data-testid": "audit-filters" },
      who, what, since, until, h("button", { type: "submit" }, "Filter"));
    let before = null;
    const page = async () => {
      const q = new URLSearchParams({ limit: String(AUDIT_PAGE) });
      if (before) q.set("before_id", String(before));
      for (const [input, name] of [[who, "actor"], [what, "action"], [since, "from"], [until, "to"]]) {
        if (input.value.trim()) q.set(name, input.value.trim());
      }
      const data = (await get("/v1/audit-events?" + q)).data;
      tbody.append(...data.events.map((e) => h("tr", { "data-audit": e.action },
        h("td", {}, new Date(e.created_at).toLocaleString()), h("td", {}, e.actor.email || "—"), h("td", {}, e.action),
        h("td", {}, `${e.target.type}${e.target.id ? " " + e.target.id : ""}`))));
      before = data.next_before_id;
      older.hidden = !before;
    };
    older.addEventListener("click", page);
    filters.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      clearErrors(filters);
      clear(tbody);
      before = null;
      try {
        await page();
      } catch (err) {
        showError(filters, err);
      }
    });
    main.append(card("Audit events", "audit", filters,
      h("div", { class: "table-wrap" }, h("table", { class: "list" },
        h("thead", {}, h("tr", {}, ["When", "Who", "Action", "Target"].map((t) => h("th", { scope: "col" }, t)))), tbody)), older));
    await page();
  }
  return null;
}
