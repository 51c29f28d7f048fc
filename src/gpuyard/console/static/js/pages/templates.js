// Templates: the account's saved cluster configurations (/v1/templates). A cluster
// created from one takes what its create leaves out. Secret env values are stored
// sealed and only ever come back masked; sending the mask back keeps the value, so
// editing a template never needs (or shows) its secrets. A key that may not change
// them (a read key, a viewer) gets the list only.
import { del, get, patch, post } from "../api.js";
import { session } from "../session.js";
import { clear, clearErrors, field, flash, h, showError } from "../ui.js";

const MASK = "********";

// "KEY=VALUE" lines into a map; blank lines and "# ..." skipped.
function parseLines(text) {
  const out = {};
  for (const raw of text.split("\n")) {
    const line = raw.trim();
    if (!line || line.startsWith("#")) continue;
    const cut = line.indexOf("=");
    if (cut <= 0) throw new Error(`"${line}" is not KEY=VALUE`);
    out[line.slice(0, cut).trim()] = line.slice(cut + 1);
  }
  return out;
}

// "8888/http, 22" into the API's ports.
function parsePorts(text) {
  return text.split(",").map((s) => s.trim()).filter(Boolean).map((spec) => {
    const [port, proto] = spec.split("/");
    return { internal_port: Number(port), protocol: (proto || "tcp").toLowerCase() };
  });
}

function portsText(ports) {
  return (ports || []).map((p) => `${p.internal_port}/${p.protocol}`).join(", ");
}

export async function render(main) {
  const tbody = h("tbody");
  const inp = (name, attrs = {}) => h("input", { name, "data-field": name, ...attrs });
  const name = inp("name", { required: true, placeholder: "jupyter" });
  const image = inp("docker_image", { required: true, placeholder: "runpod/pytorch:2.1", autocomplete: "off" });
  const args = inp("docker_args", { placeholder: "the command (optional)" });
  const ports = inp("ports", { placeholder: "8888/http, 22/tcp" });
  const disk = inp("container_disk_gb", { type: "number", min: 1, value: 10 });
  const volume = inp("volume_gb", { type: "number", min: 0, value: 0 });
  const mount = inp("volume_mount_path", { value: "/workspace" });
  const auth = h("select", { name: "container_registry_auth_id", "data-field": "container_registry_auth_id" });
  const env = h("textarea", { name: "env", "data-field": "env", rows: 3, placeholder: "MODE=dev" });
  const secretEnv = h("textarea", { name: "secret_env", "data-field": "secret_env", rows: 2, placeholder: "HF_TOKEN=hf_...", autocomplete: "off" });
  const script = h("textarea", { name: "start_script", "data-field": "start_script", rows: 3, placeholder: "#!/bin/sh\n..." });
  const title = h("h2", {}, "New template");
  const submit = h("button", { type: "submit", class: "primary" }, "Save the template");
  const cancel = h("button", { type: "button", hidden: true, onclick: () => reset() }, "Cancel");
  const form = h("form", { class: "card", "data-testid": "template-form" }, title,
    h("div", { class: "grid" },
      field("Name", name), field("Image", image), field("Docker args", args, "empty: the start script, else the image's command"),
      field("Ports", ports, "internal/protocol, comma separated"), field("Container disk (GB)", disk),
      field("Volume (GB)", volume), field("Mount path", mount), field("Registry credentials", auth)),
    field("Environment", env, "KEY=VALUE, one a line"),
    field("Secret environment", secretEnv, `KEY=VALUE, stored sealed and shown as ${MASK}; leave ${MASK} to keep a value`),
    field("Start script", script, "run with /bin/sh -c when there are no docker args"),
    h("div", { class: "actions" }, submit, cancel));
  let editing = null;

  main.append(
    h("h1", {}, "Templates"),
    h("p", { class: "muted" }, "Saved configurations: a cluster created from a template takes what its create leaves out."),
    session.canWrite ? form : null,
    h("div", { class: "table-wrap" }, h("table", { class: "list", "data-testid": "templates" },
      h("thead", {}, h("tr", {}, ["Name", "Image", "Environment", "Ports", "Registry", ""].map((t) => h("th", { scope: "col" }, t)))),
      tbody)),
  );

  async function loadAuths(selected) {
    const auths = (await get("/v1/registry-auths")).data.registry_auths;
    clear(auth).append(h("option", { value: "" }, "none (a public image)"),
      ...auths.map((a) => h("option", { value: String(a.id) }, `${a.name} (${a.id})`)));
    auth.value = selected || "";
  }

  function reset() {
    editing = null;
    form.reset();
    clearErrors(form);
    title.textContent = "New template";
    submit.textContent = "Save the template";
    cancel.hidden = true;
  }

  function edit(t) {
    editing = t;
    clearErrors(form);
    title.textContent = `Edit ${t.name}`;
    submit.textContent = "Save the changes";
    cancel.hidden = false;
    name.value = t.name;
    image.value = t.docker_image;
    args.value = t.docker_args;
    ports.value = portsText(t.ports);
    disk.value = t.container_disk_gb;
    volume.value = t.volume_gb;
    mount.value = t.volume_mount_path;
    auth.value = t.container_registry_auth_id || "";
    const entries = Object.entries(t.env || {});
    env.value = entries.filter(([, v]) => v !== MASK).map(([k, v]) => `${k}=${v}`).join("\n");
    secretEnv.value = entries.filter(([, v]) => v === MASK).map(([k]) => `${k}=${MASK}`).join("\n");
    script.value = t.start_script || "";
    form.scrollIntoView({ block: "start" });
  }

  async function refresh() {
    const templates = (await get("/v1/templates?per_page=200")).data.templates;
    if (!templates.length) {
      clear(tbody).append(h("tr", {}, h("td", { colspan: 6, class: "muted" }, "no templates yet")));
      return;
    }
    clear(tbody).append(...templates.map((t) => h("tr", { "data-template-id": t.id },
      h("td", {}, t.name),
      h("td", {}, h("code", {}, t.docker_image)),
      h("td", {}, Object.entries(t.env || {}).map(([k, v]) => `${k}=${v}`).join(" ") || "—"),
      h("td", {}, portsText(t.ports) || "—"),
      h("td", {}, t.container_registry_auth_id || "—"),
      h("td", {}, session.canWrite ? [
        h("a", { href: `#/clusters/new?template=${encodeURIComponent(t.id)}` }, "Create a cluster"), " ",
        h("button", { type: "button", onclick: () => edit(t) }, "Edit"),
        h("button", { type: "button", class: "danger", onclick: () => remove(t) }, "Delete")] : null))));
  }

  async function remove(t) {
    if (!window.confirm(`Delete template ${t.name}? Clusters made from it keep running.`)) return;
    try {
      await del(`/v1/templates/${t.id}`);
      flash(`template ${t.name} deleted`);
      if (editing && editing.id === t.id) reset();
    } catch (err) {
      flash(err.message, "error");
    }
    refresh();
  }

  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    clearErrors(form);
    let body;
    try {
      const secrets = parseLines(secretEnv.value);
      const envMap = parseLines(env.value);
      for (const [k, v] of Object.entries(secrets)) envMap[k] = { value: v, secret: true };
      body = {
        name: name.value.trim(),
        docker_image: image.value.trim(),
        docker_args: args.value,
        ports: parsePorts(ports.value),
        container_disk_gb: Number(disk.value),
        volume_gb: Number(volume.value),
        volume_mount_path: mount.value.trim(),
        env: envMap,
        start_script: script.value,
        container_registry_auth_id: auth.value || null,
      };
    } catch (err) {
      showError(form, { message: err.message, field: "env", details: { field: "env" } });
      return;
    }
    try {
      if (editing) {
        await patch(`/v1/templates/${editing.id}`, body);
        flash(`template ${body.name} saved`);
      } else {
        await post("/v1/templates", body);
        flash(`template ${body.name} created`);
      }
      reset();
      refresh();
    } catch (err) {
      showError(form, err);
    }
  });
  await Promise.all([session.canWrite ? loadAuths("") : null, refresh()]);
}
