// API keys: the caller's keys in the acting account; a new key is shown once. The key
// this browser signed in with is marked, and revoking it (after a confirmation that
// says so) signs the browser out.
import { del, get, post } from "../api.js";
import { clear, copyText, field, flash, h, showError } from "../ui.js";
import { session, signOut } from "../session.js";

export async function render(main) {
  const tbody = h("tbody");
  const shown = h("div", { "data-testid": "new-key" });
  const name = h("input", { name: "name", "data-field": "name", required: true, placeholder: "laptop" });
  const scope = h("select", { name: "scope", "data-field": "scope" }, ["read", "write"].map((s) => h("option", { value: s, selected: s === "write" }, s)));
  const form = h("form", { class: "card" }, h("h2", {}, "Create a key"),
    h("div", { class: "grid" }, field("Name", name), field("Scope", scope)),
    h("button", { type: "submit", class: "primary" }, "Create the key"));

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
    const inUse = session.info ? session.info.key.id : null;
    clear(tbody).append(...keys.map((k) => h("tr", { "data-key-id": k.id, class: k.id === inUse ? "current" : "" },
      h("td", {}, k.name, k.id === inUse ? h("span", { class: "badge", "data-testid": "key-in-use" }, "this browser is signed in with this key") : null),
      h("td", {}, h("code", {}, k.prefix + "…")), h("td", {}, k.scope),
      h("td", {}, k.created_at ? new Date(k.created_at).toLocaleString() : "—"),
      h("td", {}, h("button", { type: "button", class: "danger", onclick: () => revoke(k) }, "Revoke this key")))));
  }

  async function revoke(k) {
    const mine = session.info && k.id === session.info.key.id;
    const question = mine
      ? `Revoke key ${k.name} (${k.prefix}…)? This browser is signed in with it: you will be signed out, and anything else using it stops working.`
      : `Revoke key ${k.name} (${k.prefix}…)? Anything using it stops working.`;
    if (!window.confirm(question)) return;
    try {
      await del(`/v1/api-keys/${k.id}`);
      flash("key revoked");
    } catch (err) {
      flash(err.message, "error");
      return;
    }
    if (mine) {
      await signOut().catch(() => null);
      window.dispatchEvent(new CustomEvent("gpuyard:signed-out"));
      return;
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
