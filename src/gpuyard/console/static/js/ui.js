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

// Show an ApiError on the form control it names (data-field), else on the form.
export function showError(form, error) {
  for (const el of form.querySelectorAll(".field-error")) el.remove();
  for (const el of form.querySelectorAll("[aria-invalid]")) el.removeAttribute("aria-invalid");
  const field = error.field;
  let target = field ? form.querySelector(`[data-field="${CSS.escape(field)}"]`) : null;
  if (!target && field) {
    // "ports[2].internal_port" -> the ports editor; "env.X" -> the env editor.
    const head = field.split(/[.[]/)[0];
    target = form.querySelector(`[data-field="${CSS.escape(head)}"]`);
  }
  const message = h("p", { class: "field-error", role: "alert" }, error.message);
  if (target) {
    target.setAttribute("aria-invalid", "true");
    target.closest("label, fieldset, .row")?.append(message) ?? target.after(message);
    if (typeof target.focus === "function") target.focus();
  } else {
    form.prepend(message);
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
