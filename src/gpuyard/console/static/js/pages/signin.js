// Sign in with an API key: the server keeps it (sealed) and gives this browser an
// HttpOnly session cookie; the field is emptied straight away.
import { h, showError } from "../ui.js";
import { session, signIn } from "../session.js";

export function render(main) {
  if (session.info) {
    location.hash = "#/clusters";
    return;
  }
  const input = h("input", {
    id: "api-key",
    name: "api_key",
    type: "password",
    autocomplete: "off",
    spellcheck: "false",
    required: true,
    placeholder: "gy_…",
    "data-field": "api_key",
  });
  const submit = h("button", { type: "submit", class: "primary" }, "Sign in");
  const form = h(
    "form",
    { class: "card narrow", "aria-labelledby": "signin-title" },
    h("h1", { id: "signin-title" }, "Sign in"),
    h("p", { class: "muted" }, "Use an API key (", h("code", {}, "gpuyard keys create"), " or the one ", h("code", {}, "gpuyard serve"), " printed at first start)."),
    h("label", { class: "row" }, h("span", { class: "label" }, "API key"), input),
    submit,
  );
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    submit.disabled = true;
    const key = input.value.trim();
    input.value = "";
    try {
      await signIn(key);
      window.dispatchEvent(new CustomEvent("gpuyard:signed-in"));
    } catch (err) {
      if (!err.field) err.details = { ...err.details, field: "api_key" };
      showError(form, err);
    } finally {
      submit.disabled = false;
    }
  });
  main.append(form);
  input.focus();
}
