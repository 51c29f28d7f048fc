// Secrets: the account's named secrets, which a cluster's env uses as
// {{ RUNPOD_SECRET_name }}. Values go to the server and are never shown again (no
// answer holds one); a new value replaces the old one.
import { del, get, patch, post } from "../api.js";
import { clear, copyText, field, flash, h, showError } from "../ui.js";

export async function render(main) {
  const tbody = h("tbody");
  const name = h("input", { name: "name", "data-field": "name", required: true, placeholder: "hf_token", pattern: "[A-Za-z0-9_-]{1,100}" });
  const value = h("input", { name: "value", "data-field": "value", type: "password", required: true, autocomplete: "off" });
  const description = h("input", { name: "description", "data-field": "description", placeholder: "what it is for" });
  const form = h("form", { class: "card" }, h("h2", {}, "Add a secret"),
    h("p", { class: "muted" }, "Use it in a cluster's environment as {{ RUNPOD_SECRET_<name> }}: the container gets the value when it starts."),
    h("div", { class: "grid" }, field("Name", name, "letters, digits, - and _"), field("Value", value), field("Description", description)),
    h("button", { type: "submit", class: "primary" }, "Add the secret"));

  main.append(
    h("h1", {}, "Secrets"),
    form,
    h("div", { class: "table-wrap" }, h("table", { class: "list", "data-testid": "secrets" },
      h("thead", {}, h("tr", {}, ["Name", "Reference", "Description", "Updated", ""].map((t) => h("th", { scope: "col" }, t)))),
      tbody)),
  );

  async function refresh() {
    const secrets = (await get("/v1/secrets")).data.secrets;
    if (!secrets.length) {
      clear(tbody).append(h("tr", {}, h("td", { colspan: 5, class: "muted" }, "no secrets yet")));
      return;
    }
    clear(tbody).append(...secrets.map((s) => h("tr", { "data-secret-id": s.id },
      h("td", {}, s.name),
      h("td", {}, h("code", {}, s.reference), " ",
        h("button", { type: "button", class: "link", onclick: (e) => copyText(s.reference, e.target) }, "Copy")),
      h("td", {}, s.description || "—"),
      h("td", {}, s.updated_at ? new Date(s.updated_at).toLocaleString() : "—"),
      h("td", {},
        h("button", { type: "button", onclick: () => replace(s) }, "New value"),
        h("button", { type: "button", class: "danger", onclick: () => remove(s) }, "Delete")))));
  }

  async function replace(s) {
    const next = window.prompt(`New value of ${s.name} (clusters get it at their next start):`);
    if (!next) return;
    try {
      await patch(`/v1/secrets/${s.id}`, { value: next });
      flash(`secret ${s.name} updated`);
    } catch (err) {
      flash(err.message, "error");
    }
    refresh();
  }

  async function remove(s) {
    if (!window.confirm(`Delete secret ${s.name}? Clusters whose environment uses it cannot start until it exists again.`)) return;
    try {
      await del(`/v1/secrets/${s.id}`);
      flash(`secret ${s.name} deleted`);
    } catch (err) {
      flash(err.message, "error");
    }
    refresh();
  }

  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    try {
      await post("/v1/secrets", { name: name.value.trim(), value: value.value, description: description.value });
      name.value = "";
      value.value = "";
      description.value = "";
      flash("secret added");
      refresh();
    } catch (err) {
      showError(form, err);
    }
  });
  await refresh();
}
