// One training cluster: status, plan and price, the SSH string, its auto-termination
// policy with a countdown, its nodes (role, status, host, GPUs, lifecycle script
// result), Slurm's `sinfo` state, reserved IPs and security groups, events, and seed
// 002's nine actions and update_auto_terminate with their inputs (only those the
// cluster's status allows, for a key that may change things) and delete.
import { del, get, put } from "../api.js";
import { clear, copyText, field, flash, h, rate, showError, statusBadge } from "../ui.js";
import { poll } from "../poll.js";
import { session } from "../session.js";
import { parseScope, scopeQuery, trainingPath } from "../training_scope.js";
import { planLabel } from "./training.js";
import { policyInputs, policyLine } from "../autoterm.js";

// Each action's inputs, built from what the project has: [field, control, read].
const INPUTS = {
  update_ssh_keys: (o) => [["ssh_key_ids", multi(o.keys.map((k) => [k.id, k.name]))]],
  update_image: (o) => [["image_version_id", select(o.images.map((i) => [i.id, `${i.name} ${i.version}`]))]],
  restart_workers: () => [],
  restart_cluster: () => [],
  scale_cluster: () => [["additional_nodes", number(1)]],
  attach_ip: (o) => [["reserved_ip_id", select(o.ips.filter((ip) => ip.status === "reserved").map((ip) => [ip.id, ip.address]))]],
  detach_ip: (o) => [["reserved_ip_id", select(o.cluster.reserved_ips.map((ip) => [ip.id, ip.address]))], ["ip_type", select([["reserved", "reserved"], ["public", "public"]], false)]],
  add_security_group: (o) => [["security_groups_ids", multi(o.groups.map((g) => [g.id, g.name]))]],
  remove_security_group: (o) => [["security_group_id", select(o.cluster.security_groups.map((g) => [g.id, g.name]))]],
  update_auto_terminate: (o) => [["auto_terminate", policyInputs(o.cluster.auto_terminate)]],
};

// Each action's button in the user's words (the API's name otherwise, made readable).
const LABEL = {
  update_ssh_keys: "Change the SSH keys",
  update_image: "Change the image",
  restart_workers: "Restart the workers",
  restart_cluster: "Restart the whole cluster",
  scale_cluster: "Add worker nodes",
  attach_ip: "Attach a reserved IP",
  detach_ip: "Detach an IP",
  add_security_group: "Add a security group",
  remove_security_group: "Remove a security group",
  update_auto_terminate: "Change auto-termination",
};

const CONFIRM = {
  restart_workers: "Restart every worker node?",
  restart_cluster: "Restart the whole cluster (controller and workers)?",
  update_image: "Rebuild every node on the new image?",
};

function select(pairs, numeric = true) {
  const el = h("select", {}, pairs.map(([v, label]) => h("option", { value: String(v) }, label)));
  el.read = () => (el.value === "" ? null : numeric ? Number(el.value) : el.value);
  return el;
}

function multi(pairs) {
  const box = h("div", { class: "checks" }, pairs.map(([v, label]) =>
    h("label", { class: "inline" }, h("input", { type: "checkbox", value: String(v) }), ` ${label}`)));
  box.read = () => [...box.querySelectorAll("input:checked")].map((b) => Number(b.value));
  return box;
}

function number(value) {
  const el = h("input", { type: "number", min: "1", value: String(value) });
  el.read = () => Number(el.value);
  return el;
}

export async function render(main, [id, query]) {
  const scope = parseScope(query);
  main.append(h("p", {}, h("a", { href: "#/training" + (scope ? "?" + scopeQuery(scope) : "") }, "← Training clusters")));
  if (!scope) {
    main.append(h("p", { class: "field-error" }, "This link lacks its project_id and location."));
    return null;
  }
  let cluster = null;
  let choices = null; // what the action inputs offer: SSH keys, images, reserved IPs, groups
  const title = h("h1", {}, `Training cluster #${id}`);
  const badge = h("span");
  const reason = h("p", { class: "muted" });
  const facts = h("dl", { class: "facts" });
  const ssh = h("div", { class: "ssh" });
  const autoterm = h("p", { "data-testid": "training-autoterm" });
  let fetchedAt = Date.now(); // when the shown cluster was read: the countdown's origin
  const nodes = h("tbody");
  const sinfo = h("div", { "data-testid": "sinfo" });
  const network = h("div");
  const events = h("ol", { class: "events", "data-testid": "training-events" });
  const actionBar = h("div", { class: "actions", "data-testid": "training-actions" });
  const actionForm = h("form", { class: "card", hidden: true, "data-testid": "training-action-form" });

  main.append(
    h("div", { class: "page-head" }, title, badge),
    reason,
    actionBar,
    actionForm,
    h("div", { class: "columns" },
      h("section", { class: "card" }, h("h2", {}, "Details"), facts, autoterm, ssh),
      h("section", { class: "card" }, h("h2", {}, "Network"), network)),
    h("section", { class: "card" }, h("h2", {}, "Nodes"),
      h("div", { class: "table-wrap" }, h("table", { class: "list", "data-testid": "training-nodes" },
        h("thead", {}, h("tr", {}, ["Node", "Role", "Status", "Host", "GPUs", "Lifecycle script", "Restarts"].map((t) => h("th", { scope: "col" }, t)))),
        nodes))),
    h("section", { class: "card" }, h("h2", {}, "Slurm (sinfo)"), sinfo),
    h("section", { class: "card" }, h("h2", {}, "Events"), h("p", { class: "muted small" }, "Newest first"), events),
  );

  async function loadChoices() {
    const q = new URLSearchParams({ project_id: scope.project_id });
    const [keys, images, ips, groups] = await Promise.all([
      get("/v1/ssh-keys").then((a) => a.data.ssh_keys, () => []),
      get("/v1/images").then((a) => a.data.images, () => []),
      get("/v1/reserved-ips?" + q).then((a) => a.data.reserved_ips, () => []),
      get("/v1/security-groups?" + q).then((a) => a.data.security_groups, () => []),
    ]);
    choices = { keys, images, ips, groups };
  }

  async function openAction(action) {
    if (!choices) await loadChoices();
    const inputs = INPUTS[action]({ ...choices, cluster });
    clear(actionForm).append(
      h("h2", {}, LABEL[action] || action.replace(/_/g, " ")),
      ...inputs.map(([name, control]) => {
        control.dataset.field = name;
        control.setAttribute("name", name);
        return control.tagName === "FIELDSET" ? control : field(name.replace(/_/g, " "), control);
      }),
      h("div", { class: "actions" },
        h("button", { type: "submit", class: "primary", "data-testid": "training-action-submit" }, LABEL[action] || action.replace(/_/g, " ")),
        h("button", { type: "button", onclick: () => (actionForm.hidden = true) }, "Cancel")));
    actionForm.hidden = false;
    actionForm.onsubmit = async (ev) => {
      ev.preventDefault();
      if (CONFIRM[action] && !window.confirm(CONFIRM[action])) return;
      const body = { action };
      for (const [name, control] of inputs) body[name] = control.read();
      try {
        const answer = await put(trainingPath(scope, `${id}/`), body);
        actionForm.hidden = true;
        flash(answer.data && typeof answer.data === "string" ? answer.data : `${action} done`);
        choices = null; // reserved IPs and groups may have changed hands
      } catch (err) {
        showError(actionForm, err);
      }
      poller.now();
    };
    actionForm.querySelector("select, input")?.focus();
  }

  async function remove() {
    if (!window.confirm(`Delete training cluster ${cluster.name}? Every node and its Slurm state go.`)) return;
    try {
      await del(trainingPath(scope, `${id}/`));
      flash("deletion started");
    } catch (err) {
      flash(err.message, "error");
    }
    poller.now();
  }

  function renderActions(c) {
    clear(actionBar);
    if (!session.canWrite) return;
    for (const action of c.allowed_actions || []) {
      actionBar.append(h("button", { type: "button", "data-training-action": action, onclick: () => openAction(action) }, LABEL[action] || action.replace(/_/g, " ")));
    }
    if (!["deleting", "deleted"].includes(c.status)) {
      actionBar.append(h("button", { type: "button", class: "danger", "data-training-action": "delete", onclick: remove }, "Delete the cluster"));
    }
  }

  function fact(term, value) {
    facts.append(h("dt", {}, term), h("dd", {}, value));
  }

  function renderCluster(c) {
    title.textContent = c.name;
    clear(badge).append(statusBadge(c.status));
    reason.textContent = [c.status_reason, c.error_message].filter(Boolean).join(" — ");
    clear(facts);
    fact("Id", `#${c.id}`);
    fact("Plan", planLabel(c.plan) + (c.plan && c.plan.sku_id ? ` (sku ${c.plan.sku_id})` : ""));
    fact("Workers", String(c.no_of_nodes));
    fact("Image", c.image_version ? `${c.image_version.name} ${c.image_version.version}` : "—");
    fact("Price", rate(c.price_per_hour));
    fact("Controller", c.controller);
    fact("Lifecycle script", c.lifecycle_script ? "yes" : "none");
    tickCountdown();
    clear(ssh);
    if (c.ssh && c.ssh.command) {
      ssh.append("SSH: ", h("code", { "data-testid": "training-ssh" }, c.ssh.command), " ",
        h("button", { type: "button", onclick: (ev) => copyText(c.ssh.command, ev.target) }, "Copy"));
    }
    clear(nodes).append(...c.nodes.map((n) => h("tr", { "data-node": n.name },
      h("td", {}, n.name),
      h("td", {}, n.role),
      h("td", {}, statusBadge(n.status)),
      h("td", {}, n.host || "—"),
      h("td", {}, n.gpu_indices.length ? n.gpu_indices.join(", ") : "—"),
      h("td", {}, n.lifecycle ? `${n.lifecycle.status}${n.lifecycle.exit_code !== null ? ` (exit ${n.lifecycle.exit_code})` : ""}` : "—",
        n.lifecycle && n.lifecycle.log ? h("div", { class: "muted small" }, n.lifecycle.log) : null),
      h("td", {}, String(n.restarts)))));
    clear(sinfo);
    if (!c.slurm.available) {
      sinfo.append(h("p", { class: "muted" }, `Partition ${c.slurm.partition}: the controller does not answer (yet).`));
    } else {
      sinfo.append(h("table", { class: "list" },
        h("thead", {}, h("tr", {}, h("th", { scope: "col" }, "NodeName"), h("th", { scope: "col" }, `State (partition ${c.slurm.partition})`))),
        h("tbody", {}, c.slurm.nodes.map((n) => h("tr", {}, h("td", {}, n.name), h("td", {}, n.state))))));
    }
    clear(network).append(
      h("h3", {}, "Reserved IPs"),
      c.reserved_ips.length ? h("ul", { "data-testid": "training-ips" }, c.reserved_ips.map((ip) => h("li", {}, ip.address))) : h("p", { class: "muted" }, "none"),
      h("h3", {}, "Security groups"),
      c.security_groups.length ? h("ul", { "data-testid": "training-groups" }, c.security_groups.map((g) => h("li", {}, `${g.name} (#${g.id})`))) : h("p", { class: "muted" }, "none"),
    );
    renderActions(c);
  }

  function tickCountdown() {
    if (cluster) autoterm.textContent = policyLine(cluster.auto_terminate, fetchedAt, cluster.status);
  }
  const ticker = setInterval(tickCountdown, 1000);

  let eventsEtag = null; // the ETag of the events shown, for the next poll's 304
  async function refresh(etag) {
    let answer;
    try {
      answer = await get(trainingPath(scope, `${id}/`), { etag });
    } catch (err) {
      if (err.status === 404 && cluster) {
        clear(badge).append(statusBadge("deleted"));
        clear(actionBar);
        poller.stop();
        return null;
      }
      throw err;
    }
    // A 304 (answer.notModified): the cluster is as shown.
    if (!answer.notModified) {
      cluster = answer.data;
      fetchedAt = Date.now();
      renderCluster(cluster);
    }
    const evs = await get(trainingPath(scope, `${id}/events/`), { etag: eventsEtag });
    if (!evs.notModified) {
      clear(events).append(...evs.data.slice(-50).reverse().map((e) =>
        h("li", {}, h("time", { datetime: e.at }, new Date(e.at).toLocaleString()), " ", e.message || `${e.from_status} → ${e.to_status}`)));
      eventsEtag = evs.etag;
    }
    return answer;
  }

  const poller = poll(refresh, 4000);
  return () => {
    clearInterval(ticker);
    poller.stop();
  };
}
