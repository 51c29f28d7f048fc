// Registry credentials: the account's private registry logins (/v1/registry-auths)
// that clusters and templates pull their images with. A password goes to the server
// in a password input and is never shown again (no answer holds one). A key that may
// not change them (a read key, a viewer) gets the list only.
import { del, get, patch, post } from "../api.js";
import { session } from "../session.js";
import { clear, field, flash, h, showError } from "../ui.js";

export async function render(main) {
  const tbody = h("tbody");
  const name = h("input", { name: "name", "data-field": "name", required: true, placeholder: "ghcr-team" });
  const username = h("input", { name: "username", "data-field": "username", required: true, autocomplete: "off" });
  const password = h("input", { name: "password", "data-field": "password", type: "password", required: true, autocomplete: "new-password" });
  const form = h("form", { class: "card", "data-testid": "registry-auth-form" }, h("h2", {}, "Add registry credentials"),
    h("p", { class: "muted" }, "Name them on a cluster or a template: its image is pulled with them. The password (or access token) is stored encrypted and never shown."),
    h("div", { class: "grid" }, field("Name", name), field("Username", username), field("Password or token", password)),
    h("button", { type: "submit", class: "primary" }, "Add the credentials"));

  main.append(
    h("h1", {}, "Registry credentials"),
    session.canWrite ? form : null,
    h("div", { class: "table-wrap" }, h("table", { class: "list", "data-testid": "registry-auths" },
      h("thead", {}, h("tr", {}, ["ID", "Name", "Created", ""].map((t) => h("th", { scope: "col" }, t)))),
      tbody)),
  );

  // The password change: an inline form with a password input under the row.
  function changeRow(a) {
    const user = h("input", { name: "username", "data-field": "username", placeholder: "unchanged", autocomplete: "off" });
    const pass = h("input", { name: "password", "data-field": "password", type: "password", required: true, autocomplete: "new-password" });
    const change = h("form", { class: "inline-form", "data-testid": "registry-auth-update" },
      h("div", { class: "grid" }, field("New username", user), field("New password", pass)),
      h("div", { class: "actions" }, h("button", { type: "submit", class: "primary" }, "Save"),
        h("button", { type: "button", onclick: () => row.remove() }, "Cancel")));
    const row = h("tr", { class: "edit-row" }, h("td", { colspan: 4 }, change));
    change.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const body = { password: pass.value };
      if (user.value.trim()) body.username = user.value.trim();
      try {
        await patch(`/v1/registry-auths/${a.id}`, body);
        flash(`registry credentials ${a.name} updated: clusters pull with them from their next start`);
        refresh();
      } catch (err) {
        showError(change, err);
      }
    });
    return row;
  }

  async function refresh() {
    const auths = (await get("/v1/registry-auths")).data.registry_auths;
    if (!auths.length) {
      clear(tbody).append(h("tr", {}, h("td", { colspan: 4, class: "muted" }, "no registry credentials yet")));
      return;
    }
    clear(tbody).append(...auths.map((a) => {
      const tr = h("tr", { "data-registry-auth-id": a.id },
        h("td", {}, String(a.id)),
        h("td", {}, a.name),
        h("td", {}, a.created_at ? new Date(a.created_at).toLocaleString() : "—"),
        h("td", {}, session.canWrite ? [
          h("button", { type: "button", onclick: () => { if (!tr.nextSibling?.classList?.contains("edit-row")) tr.after(changeRow(a)); } }, "Update password"),
          h("button", { type: "button", class: "danger", onclick: () => remove(a) }, "Delete")] : null));
      return tr;
    }));
  }

  async function remove(a) {
    if (!window.confirm(`Delete registry credentials ${a.name}?`)) return;
    try {
      await del(`/v1/registry-auths/${a.id}`);
      flash(`registry credentials ${a.name} deleted`);
    } catch (err) {
      // In use: the answer names the templates and clusters that still use them.
      flash(err.message, "error");
    }
    refresh();
  }

  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    try {
      await post("/v1/registry-auths", { name: name.value.trim(), username: username.value.trim(), password: password.value });
      form.reset();
      flash("registry credentials added");
      refresh();
    } catch (err) {
      showError(form, err);
    }
  });
  await refresh();
}
