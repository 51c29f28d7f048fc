// A training cluster's auto-termination policy: the inputs (on the create form and in
// the update_auto_terminate action) and the detail's line with its countdown. The
// controls carry data-field="auto_terminate.<field>", so an API error lands on the
// input it names.
import { duration, field, h } from "./ui.js";

function number(name, attrs, value) {
  const el = h("input", { type: "number", name: `auto_terminate.${name}`, "data-field": `auto_terminate.${name}`, ...attrs });
  if (value !== null && value !== undefined) el.value = String(value);
  return el;
}

// The policy's inputs in a fieldset. `current`: the stored policy to start from (the
// update form sends every field: an emptied rule is removed). read() gives the
// auto_terminate object, or null when `current` is absent and nothing was filled in.
export function policyInputs(current = null) {
  const p = current || {};
  const idle = number("idle_minutes", { min: "0", step: "any", placeholder: "minutes" }, p.idle_minutes);
  const cost = number("cost_limit_usd", { min: "0", step: "0.01", placeholder: "USD" }, p.cost_limit_usd);
  const hours = number("max_runtime_hours", { min: "0", step: "any", placeholder: "hours" }, p.max_runtime_hours);
  const action = h("select", { name: "auto_terminate.action", "data-field": "auto_terminate.action", "aria-label": "Auto-terminate action" },
    h("option", { value: "stop" }, "stop (keeps the Slurm state)"), h("option", { value: "delete" }, "delete"));
  action.value = p.action === "delete" ? "delete" : "stop";
  const enabled = h("input", { type: "checkbox", name: "auto_terminate.enabled", "data-field": "auto_terminate.enabled", checked: current ? current.enabled !== false : true });
  const box = h("fieldset", { "data-field": "auto_terminate", "data-testid": "training-autoterm-inputs", tabindex: "-1" },
    h("legend", {}, "Auto-terminate"),
    h("div", { class: "grid" },
      field("When idle for (min)", idle, "no running or pending Slurm job"),
      field("When the run cost reaches (USD)", cost),
      field("After running (h)", hours),
      field("Then", action)),
    current ? h("label", { class: "inline" }, enabled, " enabled") : null);
  const num = (el) => (el.value === "" ? null : Number(el.value));
  box.read = () => {
    const rules = { idle_minutes: num(idle), cost_limit_usd: num(cost), max_runtime_hours: num(hours) };
    if (!current) {
      const given = Object.fromEntries(Object.entries(rules).filter(([, v]) => v !== null));
      return Object.keys(given).length ? { ...given, action: action.value } : null;
    }
    return { ...rules, action: action.value, enabled: enabled.checked };
  };
  return box;
}

// One line: the rules, the action and what fires next (only a running cluster's
// deadlines count down). `fetchedAt` (Date.now() when
// the policy was read) turns the server's seconds_left into a countdown that does not
// depend on this machine's clock being right.
export function policyLine(p, fetchedAt, status) {
  if (!p || !p.enabled) return "Auto-terminate: off";
  const rules = [];
  if (p.idle_minutes !== null && p.idle_minutes !== undefined) rules.push(`idle ${p.idle_minutes} min`);
  if (p.cost_limit_usd !== null && p.cost_limit_usd !== undefined) rules.push(`cost $${Number(p.cost_limit_usd).toFixed(2)}`);
  if (p.max_runtime_hours !== null && p.max_runtime_hours !== undefined) rules.push(`runtime ${p.max_runtime_hours} h`);
  const head = `Auto-terminate: ${rules.join(", ") || "no rule"} → ${p.action || "stop"}`;
  if (p.error) return `${head} (not enforced: ${p.error})`;
  if (status !== "running") return `${head}; counts while running`;
  if (p.seconds_left === null || p.seconds_left === undefined) {
    return p.idle_minutes ? `${head}; not idle (a job runs or waits, or not sampled yet)` : head;
  }
  const left = p.seconds_left - (Date.now() - fetchedAt) / 1000;
  return `${head}; ${p.next_rule.replace("_", " ")} in ${duration(left)}`;
}
