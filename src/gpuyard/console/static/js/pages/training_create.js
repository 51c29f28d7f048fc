// Create a training cluster from a plan (GET /v1/plans: GPUs, vCPUs and memory per
// node and the price per node-hour): name, image version, SSH keys, worker count,
// an optional security group, lifecycle script and auto-termination policy. The hourly price shown is the
// plan's price times the workers (the controller's own rate is on the cluster once
// made). Errors land on the field the API names.
import { get, post } from "../api.js";
import { clearErrors, field, h, rate, showError } from "../ui.js";
import { loadScopes, parseScope, scopePicker, scopeQuery, trainingPath } from "../training_scope.js";
import { policyInputs } from "../autoterm.js";

export async function render(main, [query]) {
  const scopes = await loadScopes(parseScope(query));
  const scope = scopes.scope;
  main.append(h("p", {}, h("a", { href: "#/training?" + (scope ? scopeQuery(scope) : "") }, "← Training clusters")));
  if (!scope) {
    main.append(h("p", { class: "muted" }, "No location has hosts yet."));
    return null;
  }
  const [plans, images, keys, groups, locations] = await Promise.all([
    get("/v1/plans").then((a) => a.data.plans),
    get("/v1/images").then((a) => a.data.images),
    get("/v1/ssh-keys").then((a) => a.data.ssh_keys),
    get("/v1/security-groups?" + new URLSearchParams({ project_id: scope.project_id })).then((a) => a.data.security_groups, () => []),
    get("/v1/locations").then((a) => a.data.locations, () => []),
  ]);
  // Free GPUs of each type in this location, and so how many nodes of a plan fit now.
  const here = locations.find((l) => l.location === scope.location);
  const freeGpus = new Map((here ? here.gpu_types : []).map((t) => [t.gpu_type, t.free_gpus]));
  const nodesFree = (p) => (p.gpus_per_node ? Math.floor((freeGpus.get(p.gpu_type) || 0) / p.gpus_per_node) : null);
  // The form starts from the first plan that fits (a worker and the controller).
  const fits = plans.find((p) => nodesFree(p) === null || nodesFree(p) >= 1);

  const name = h("input", { id: "t-name", name: "name", "data-field": "name", required: true, placeholder: "llm-train" });
  const plan = h("select", { id: "t-sku_id", name: "sku_id", "data-field": "sku_id", "data-testid": "training-plans" },
    plans.map((p) => h("option", { value: String(p.sku_id), selected: p === fits, dataset: { nodesFree: String(nodesFree(p) ?? "") } },
      `${p.name} · ${p.gpus_per_node ? `${p.gpu_type} × ${p.gpus_per_node}` : "CPU"} · ${p.cpus_per_node} vCPU · ${p.memory_gb_per_node} GB · ${rate(p.price_per_hour)} per node` +
      (p.gpus_per_node ? ` · ${freeGpus.get(p.gpu_type) || 0} GPUs free (${nodesFree(p)} nodes)` : ""))));
  const image = h("select", { id: "t-image_version_id", name: "image_version_id", "data-field": "image_version_id" },
    images.map((i) => h("option", { value: String(i.id) }, `${i.name} ${i.version}`)));
  const nodes = h("input", { id: "t-no_of_nodes", name: "no_of_nodes", "data-field": "no_of_nodes", type: "number", min: "1", value: "1" });
  const keyBoxes = keys.map((k) => h("label", { class: "inline" },
    h("input", { type: "checkbox", value: String(k.id), class: "ssh-key", checked: keys.length === 1 }), ` ${k.name} `, h("span", { class: "muted small" }, k.fingerprint)));
  const group = h("select", { id: "t-security_group_id", name: "security_group_id", "data-field": "security_group_id" },
    h("option", { value: "" }, "none"), groups.map((g) => h("option", { value: String(g.id) }, g.name)));
  const script = h("textarea", { id: "t-lifecycle_script", name: "lifecycle_script", "data-field": "lifecycle_script", rows: "4", placeholder: "#!/bin/bash\n# runs on every node once it is up" });
  const autoterm = policyInputs();
  const estimate = h("output", { class: "estimate", "data-testid": "training-estimate", "aria-live": "polite" });
  const submit = h("button", { type: "submit", class: "primary", "data-testid": "training-submit" }, "Create training cluster");

  const form = h("form", { class: "card", novalidate: true },
    h("h1", {}, "New training cluster"),
    scopePicker(scopes, (s) => (location.hash = "#/training/new?" + scopeQuery(s))),
    plans.length ? null : h("p", { class: "field-error" }, "No plans: this installation has no GPU types with hosts."),
    h("div", { class: "grid" },
      field("Name", name, "lowercase letters, digits and dashes"),
      field("Plan", plan, "per node; GPUs free in this location right now"),
      field("Workers", nodes, "plus one controller (login) node"),
      field("Image", image),
      field("Security group", group)),
    h("fieldset", { "data-field": "ssh_key_ids", tabindex: "-1" }, h("legend", {}, "SSH keys"),
      keyBoxes.length ? keyBoxes : h("p", { class: "muted" }, "No SSH keys yet: add one (POST /v1/ssh-keys or gpuyard ssh-keys add).")),
    field("Lifecycle script", script, "optional"),
    autoterm,
    h("div", { class: "submit-row" }, estimate, submit));

  function updateEstimate() {
    const p = plans.find((x) => String(x.sku_id) === plan.value);
    const n = Number(nodes.value) || 0;
    estimate.textContent = p ? `Workers: ${rate(p.price_per_hour * n)} (plus the controller)` : "";
  }
  form.addEventListener("input", updateEstimate);
  form.addEventListener("change", updateEstimate);
  updateEstimate();

  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    clearErrors(form);
    const body = {
      name: name.value.trim(),
      sku_id: plan.value ? Number(plan.value) : null,
      image_version_id: image.value ? Number(image.value) : null,
      no_of_nodes: Number(nodes.value),
      ssh_key_ids: [...form.querySelectorAll(".ssh-key:checked")].map((b) => Number(b.value)),
    };
    if (group.value) body.security_group_id = Number(group.value);
    if (script.value.trim()) body.lifecycle_script = script.value;
    const policy = autoterm.read();
    if (policy) body.auto_terminate = policy;
    submit.disabled = true;
    try {
      const created = (await post(trainingPath(scope), body)).data;
      location.hash = `#/training/${created.id}?` + scopeQuery(scope);
    } catch (err) {
      showError(form, err);
    } finally {
      submit.disabled = false;
    }
  });
  main.append(form);
  return null;
}
