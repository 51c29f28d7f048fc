// Endpoints: the account's serverless endpoints (/v1/endpoints). An endpoint is an
// image whose workers gpuyard starts as its job queue grows and stops when it empties
// (down to workers_min, to zero when that is 0). The list shows what each one's
// workers and queue are doing now; a key that may not change them (a read key, a
// viewer) gets the list only.
import { del, get, post } from "../api.js";
import { poll } from "../poll.js";
import { session } from "../session.js";
import { clear, clearErrors, field, flash, h, showError } from "../ui.js";

// "KEY=VALUE" lines into a map; blank lines and "# ..." skipped.
export function parseLines(text) {
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

export function countsText(e) {
  const w = e.workers || {};
  const j = e.jobs || {};
  return `${w.running || 0} running · ${w.idle || 0} idle · ${w.starting || 0} starting · ${j.inQueue || 0} queued · ${j.inProgress || 0} in progress`;
}

export async function render(main) {
  const tbody = h("tbody");
  const inp = (name, attrs = {}) => h("input", { name, "data-field": name, ...attrs });
  const name = inp("name", { required: true, placeholder: "echo" });
  const image = inp("image", { placeholder: "registry/worker:1", autocomplete: "off" });
  const template = h("select", { name: "template_id", "data-field": "template_id" });
  const gpus = h("select", { name: "gpu_type_ids", "data-field": "gpu_type_ids", multiple: true, size: 4 });
  const gpuCount = inp("gpu_count", { type: "number", min: 0, value: 1 });
  const wmin = inp("workers_min", { type: "number", min: 0, value: 0 });
  const wmax = inp("workers_max", { type: "number", min: 0, value: 3 });
  const idle = inp("idle_timeout_s", { type: "number", min: 1, value: 5 });
  const scaler = h("select", { name: "scaler_type", "data-field": "scaler_type" },
    h("option", { value: "QUEUE_DELAY" }, "queue delay (seconds a job waits)"),
    h("option", { value: "REQUEST_COUNT" }, "request count (jobs per worker)"));
  const scalerValue = inp("scaler_value", { type: "number", min: 1, value: 4 });
  const flashboot = inp("flashboot", { type: "checkbox" });
  const env = h("textarea", { name: "env", "data-field": "env", rows: 2, placeholder: "MODE=prod" });
  const secretEnv = h("textarea", { name: "secret_env", "data-field": "secret_env", rows: 2, placeholder: "HF_TOKEN=hf_...", autocomplete: "off" });
  const form = h("form", { class: "card", "data-testid": "endpoint-form" }, h("h2", {}, "New endpoint"),
    h("div", { class: "grid" },
      field("Name", name), field("Image", image, "or a template"), field("Template", template),
      field("GPU types", gpus), field("GPUs per worker", gpuCount),
      field("Workers min", wmin, "0: scale to zero"), field("Workers max", wmax),
      field("Idle timeout (s)", idle), field("Scaler", scaler), field("Scaler value", scalerValue),
      field("FlashBoot", flashboot, "keep idle workers stopped on their host for fast starts")),
    field("Environment", env, "KEY=VALUE, one a line"),
    field("Secret environment", secretEnv, "KEY=VALUE, stored sealed and shown masked"),
    h("div", { class: "actions" }, h("button", { type: "submit", class: "primary" }, "Create the endpoint")));

  main.append(
    h("h1", {}, "Endpoints"),
    h("p", { class: "muted" }, "Serverless endpoints: requests wait in a queue; workers start as it grows and stop when it empties."),
    session.canWrite ? form : null,
    h("div", { class: "table-wrap" }, h("table", { class: "list", "data-testid": "endpoints" },
      h("thead", {}, h("tr", {}, ["Name", "Image", "Workers", "Now", "Status", ""].map((t) => h("th", { scope: "col" }, t)))),
      tbody)),
  );

  async function loadChoices() {
    const [templates, types] = await Promise.all([get("/v1/templates"), get("/v1/gpu-types")]);
    clear(template).append(h("option", { value: "" }, "none (give an image)"),
      ...templates.data.templates.map((t) => h("option", { value: t.id }, `${t.name} (${t.docker_image})`)));
    const list = Array.isArray(types.data) ? types.data : types.data.gpu_types || [];
    clear(gpus).append(...list.map((g) => h("option", { value: g.id }, g.display_name || g.id)));
  }

  function show(endpoints) {
    if (!endpoints.length) {
      clear(tbody).append(h("tr", {}, h("td", { colspan: 6, class: "muted" }, "no endpoints yet")));
      return;
    }
    clear(tbody).append(...endpoints.map((e) => h("tr", { "data-endpoint-id": e.id },
      h("td", {}, h("a", { href: `#/endpoints/${e.id}` }, e.name), h("div", { class: "muted" }, h("code", {}, e.id))),
      h("td", {}, e.image),
      h("td", {}, `${e.workers_min}..${e.workers_max}`),
      h("td", { "data-testid": "counts" }, countsText(e), e.capacity_problem ? h("div", { class: "field-error" }, e.capacity_problem) : null),
      h("td", {}, e.status),
      h("td", {}, session.canWrite ? h("button", { type: "button", class: "danger", onclick: () => remove(e) }, "Delete") : null))));
  }

  async function refresh(etag) {
    const answer = await get("/v1/endpoints?per_page=200", { etag });
    if (!answer.notModified) show(answer.data.endpoints);
    return answer;
  }

  async function remove(e) {
    if (!window.confirm(`Delete endpoint ${e.name}? It takes no new requests; its workers finish their jobs and stop.`)) return;
    try {
      await del(`/v1/endpoints/${e.id}`);
      flash(`endpoint ${e.name} deleted`);
    } catch (err) {
      flash(err.message, "error");
    }
    poller.now();
  }

  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    clearErrors(form);
    let body;
    try {
      body = {
        name: name.value.trim(),
        gpu_type_ids: [...gpus.selectedOptions].map((o) => o.value),
        gpu_count: Number(gpuCount.value),
        workers_min: Number(wmin.value),
        workers_max: Number(wmax.value),
        idle_timeout_s: Number(idle.value),
        scaler_type: scaler.value,
        scaler_value: Number(scalerValue.value),
        flashboot: flashboot.checked,
        env: parseLines(env.value),
      };
      for (const [k, v] of Object.entries(parseLines(secretEnv.value))) body.env[k] = { value: v, secret: true };
    } catch (err) {
      showError(form, { field: "env", message: err.message });
      return;
    }
    if (image.value.trim()) body.image = image.value.trim();
    if (template.value) body.template_id = template.value;
    try {
      const made = (await post("/v1/endpoints", body)).data;
      flash(`endpoint ${made.name} created`);
      name.value = "";
      env.value = "";
      secretEnv.value = "";
      poller.now();
    } catch (err) {
      showError(form, err);
    }
  });

  if (session.canWrite) await loadChoices();
  const poller = poll(refresh, 4000);
  return () => poller.stop();
}
