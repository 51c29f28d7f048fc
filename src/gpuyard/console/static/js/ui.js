// Small DOM helpers and formatters shared by the pages. Text is always set as text
// (never innerHTML), so nothing the API returns is ever parsed as markup.

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on") && typeof value === "function") el.addEventListener(name.slice(2), value);
    else if (name === "class") el.className = value;
    else if (name === "dataset") Object.assign(el.dataset, value);
    else if (name === "value" || name === "checked" || name === "disabled" || name === "selected") el[name] = value;
    else el.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

export function clear(el) {
  while (el.firstChild) el.removeChild(el.firstChild);
  return el;
}

export function money(usd, digits = 2) {
  if (usd === null || usd === undefined || Number.isNaN(Number(usd))) return "—";
  return "$" + Number(usd).toFixed(digits);
}

export function rate(usd) {
  return money(usd, usd !== null && Math.abs(usd) < 1 ? 3 : 2) + "/h";
}

export function age(iso, now = Date.now()) {
  if (!iso) return "—";
  return duration((now - Date.parse(iso)) / 1000);
}

export function duration(seconds) {
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return s + "s";
  if (s < 3600) return Math.floor(s / 60) + "m " + (s % 60) + "s";
  if (s < 86400) return Math.floor(s / 3600) + "h " + Math.floor((s % 3600) / 60) + "m";
  return Math.floor(s / 86400) + "d " + Math.floor((s % 86400) / 3600) + "h";
}

export function statusBadge(status) {
  return h("span", { class: "badge status-" + status, "data-status": status }, status);
}

export function gpuLabel(c) {
  if (!c.gpu_count) return "CPU only";
  return (c.gpu_display_name || c.gpu_type) + " × " + c.gpu_count;
}

// A transient message at the top of the page (role=status: read by screen readers).
export function flash(text, kind = "info") {
  const box = document.getElementById("flash");
  const item = h("div", { class: "flash " + kind }, text);
  box.append(item);
  setTimeout(() => item.remove(), 6000);
}

// What one validation error says, in words, from the API's reason and limits
// (details.errors[i]: {field, message, reason, limits}); the API's message otherwise.
export function reasonWords(e) {
  const l = e.limits || {};
  switch (e.reason) {
    case "missing":
      return "required";
    case "string_too_short":
      return l.min_length > 1 ? `at least ${l.min_length} characters` : "required";
    case "string_too_long":
      return `at most ${l.max_length} characters`;
    case "too_short":
      return `at least ${l.min_length} entries`;
    case "too_long":
      return `at most ${l.max_length} entries`;
    case "greater_than_equal":
      return `at least ${l.ge}`;
    case "greater_than":
      return `more than ${l.gt}`;
    case "less_than_equal":
      return `at most ${l.le}`;
    case "less_than":
      return `less than ${l.lt}`;
    case "int_parsing":
    case "int_type":
    case "int_from_float":
      return "a whole number";
    case "float_parsing":
    case "float_type":
      return "a number";
    case "string_pattern_mismatch":
      return "not in the expected form";
    case "literal_error":
    case "enum":
      return l.expected ? `one of ${l.expected}` : "not one of the choices";
    case "extra_forbidden":
      return "not a field this form knows";
    default:
      return e.message || "invalid";
  }
}

// The control a field path names in `form` (data-field), or the editor holding it:
// "ports[2].internal_port" -> the ports editor; "env.X" -> the env editor.
function controlFor(form, path) {
  if (!path) return null;
  const exact = form.querySelector(`[data-field="${CSS.escape(path)}"]`);
  if (exact) return exact;
  const head = path.split(/[.[]/)[0];
  return form.querySelector(`[data-field="${CSS.escape(head)}"]`);
}

// The words the form shows for a control: its label, its fieldset's legend, or the
// field path made readable ("gpu_count" -> "Gpu count").
function labelFor(control, path) {
  const own = control?.closest("label")?.querySelector(".label")?.textContent || control?.getAttribute("aria-label");
  const legend = control?.tagName === "FIELDSET" ? control.querySelector("legend")?.textContent : null;
  const text = own || legend;
  if (text) return text.trim();
  const tail = String(path || "").split(".").pop().replace(/\[\d+\]/g, "");
  return tail.charAt(0).toUpperCase() + tail.slice(1).replace(/_/g, " ");
}

function errorNote(text) {
  return h("p", { class: "field-error", role: "alert" }, text);
}

// Show an ApiError where the user is looking: each field it names gets a line beside
// that control, in words ("Image: required", built from the API's field and reason);
// an error about no field (a capacity refusal, a conflict) goes beside `near` (the
// button pressed; default the form's submit button) and is scrolled into view.
// The one way every form shows what the API refused.
export function showError(form, error, near) {
  clearErrors(form);
  const listed = Array.isArray(error.details?.errors) && error.details.errors.length ? error.details.errors : null;
  const items = listed || [{ field: error.field, message: error.message }];
  let first = null;
  let unplaced = [];
  for (const item of items) {
    const target = controlFor(form, item.field);
    if (!target) {
      unplaced.push(item.field && listed ? `${labelFor(null, item.field)}: ${reasonWords(item)}` : error.message);
      continue;
    }
    const words = listed ? `${labelFor(target, item.field)}: ${reasonWords(item)}` : item.message;
    target.setAttribute("aria-invalid", "true");
    const note = errorNote(words);
    const holder = target.closest("label, fieldset, .row");
    if (holder) holder.append(note);
    else target.after(note);
    first = first || target;
  }
  if (unplaced.length) {
    const hint = error.details?.hint ? " " + error.details.hint : "";
    const button = near || form.querySelector("[type=submit]");
    const note = errorNote([...new Set(unplaced)].join("; ") + hint);
    note.dataset.testid = "form-error";
    const row = button?.closest(".submit-row, .actions, .row");
    if (row) row.after(note);
    else if (button) button.after(note);
    else form.append(note);
    note.scrollIntoView({ block: "center" });
  }
  if (first) {
    first.scrollIntoView({ block: "center" });
    if (typeof first.focus === "function") first.focus({ preventScroll: true });
  }
}

export function clearErrors(form) {
  for (const el of form.querySelectorAll(".field-error")) el.remove();
  for (const el of form.querySelectorAll("[aria-invalid]")) el.removeAttribute("aria-invalid");
}

export async function copyText(text, button) {
  try {
    await navigator.clipboard.writeText(text);
    if (button) {
      const label = button.textContent;
      button.textContent = "Copied";
      setTimeout(() => (button.textContent = label), 1500);
    }
  } catch {
    flash("Copy failed: select the text and copy it by hand", "error");
  }
}

export function field(label, control, hint) {
  return h("label", { class: "row" }, h("span", { class: "label" }, label), control, hint ? h("small", { class: "muted" }, hint) : null);
}
