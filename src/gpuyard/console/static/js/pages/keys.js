// API keys: the caller's keys in the acting account; a new key is shown once.
import { del, get, post } from "../api.js";
import { clear, copyText, field, flash, h, showError } from "../ui.js";

export async function render(main) {
  const tbody = h("tbody");
  const shown = h("div", { "data-testid": "new-key" });
  const name = h("input", { name: "name", "data-field": "name", required: true, placeholder: "laptop" });
  const scope = h("select", { name: "scope", "data-field": "scope" }, ["read", "write"].map((s) => h("option", { value: s, selected: s === "write" }, s)));
  const form = h("form", { class: "card" }, h("h2", {}, "Create a key"),
    h("div", { class: "grid" }, field("Name", name), field("Scope", scope)),
    h("button", { type: "submit", class: "primary" }, "Create key"));

  main.append(
    h("h1", {}, "API keys"),
    form,
    shown,
    h("div", { class: "table-wrap" }, h("table", { class: "list" },
      h("thead", {}, h("tr", {}, ["Name", "Prefix", "Scope", "Created", ""].map((t) => h("th", { scope: "col" }, t)))),
      tbody)),
  );

  async function refresh() {
    const keys = (await get("/v1/api-keys")).data.api_keys;
    clear(tbody).append(...keys.map((k) => h("tr", {},
      h("td", {}, k.name), h("td", {}, h("code", {}, k.prefix + "…")), h("td", {}, k.scope),
      h("td", {}, k.created_at ? new Date(k.created_at).toLocaleString() : "—"),
      h("td", {}, h("button", { type: "button", class: "danger", onclick: () => revoke(k) }, "Revoke")))));
  }

  async function revoke(k) {
    if (!window.confirm(`Revoke key ${k.name} (${k.prefix}…)? Anything using it stops working.`)) return;
    try {
      await del(`/v1/api-keys/${k.id}`);
      flash("key revoked");
    } catch (err) {
      flash(err.message, "error");
    }
    refresh();
  }

  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    try {
      const created = (await post("/v1/api-keys", { name: name.value.trim(), scope: scope.value })).data;
      name.value = "";
      const code = h("code", { class: "secret" }, created.key);
      clear(shown).append(h("div", { class: "card notice" },
        h("p", {}, h("strong", {}, "Copy this key now: it is not shown again.")), code, " ",
        h("button", { type: "button", onclick: (e) => copyText(created.key, e.target) }, "Copy"),
        h("button", { type: "button", class: "link", onclick: () => clear(shown) }, "Done")));
      refresh();
    } catch (err) {
      showError(form, err);
    }
  });
  await refresh();
}
