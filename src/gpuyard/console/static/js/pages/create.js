// Create a cluster: GPU types with prices and free counts from the catalog, the
// resources, image and command, env and ports editors, spot bid and auto-terminate.
// The estimate is the API's quote for the form (POST /v1/prices/quote: compute,
// disks and volume included), the catalog's GPU part shown at once. The API's
// errors are shown on the field they name. The volume is the cluster's own or one of
// the account's network volumes (the cluster then goes to that volume's host). Opened
// as #/clusters/new/clone/SNAPSHOT it clones: the new volume starts with the
// snapshot's data (`snapshot_id`), and the form starts from the source cluster's shape.
// A template (picked, or opened as #/clusters/new?template=ID) fills the form; the
// server takes what the form leaves empty (env, ports, registry credentials, start
// script) from it.
import { get, post } from "../api.js";
import { clearErrors, field, h, rate, showError } from "../ui.js";

function num(value) {
  return value === "" || value === null ? null : Number(value);
}

function envEditor() {
  const rows = h("div", { class: "rows" });
  const add = (name = "", value = "") => {
    const row = h(
      "div",
      { class: "pair" },
      h("input", { "aria-label": "Variable name", placeholder: "NAME", value: name, class: "env-name" }),
      h("input", { "aria-label": "Variable value", placeholder: "value", value, class: "env-value" }),
      h("button", { type: "button", class: "link", "aria-label": "Remove variable", onclick: () => row.remove() }, "✕"),
    );
    rows.append(row);
  };
  const box = h("fieldset", { "data-field": "env", tabindex: "-1" }, h("legend", {}, "Environment"), rows,
    h("button", { type: "button", onclick: () => add() }, "Add variable"));
  box.collect = () => {
    const env = {};
    for (const row of rows.children) {
      const name = row.querySelector(".env-name").value.trim();
      if (name) env[name] = row.querySelector(".env-value").value;
    }
    return env;
  };
  return box;
}

function portsEditor() {
  const rows = h("div", { class: "rows" });
  const add = (port = "", protocol = "http", visibility = "private") => {
    const row = h(
      "div",
      { class: "pair" },
      h("input", { type: "number", min: "1", max: "65535", "aria-label": "Container port", placeholder: "8888", value: port, class: "port-num" }),
      h("select", { "aria-label": "Protocol", class: "port-proto" }, ["http", "tcp"].map((p) => h("option", { value: p, selected: p === protocol }, p))),
      h("select", { "aria-label": "Visibility", class: "port-vis" }, ["private", "public"].map((v) => h("option", { value: v, selected: v === visibility }, v))),
      h("button", { type: "button", class: "link", "aria-label": "Remove port", onclick: () => row.remove() }, "✕"),
    );
    rows.append(row);
  };
  const box = h("fieldset", { "data-field": "ports", tabindex: "-1" }, h("legend", {}, "Ports"), rows,
    h("button", { type: "button", onclick: () => add(), "data-testid": "add-port" }, "Add port"));
  box.collect = () =>
    [...rows.children]
      .filter((row) => row.querySelector(".port-num").value !== "")
      .map((row) => ({
        internal_port: Number(row.querySelector(".port-num").value),
        protocol: row.querySelector(".port-proto").value,
        visibility: row.querySelector(".port-vis").value,
      }));
  return box;
}

// The snapshot to clone and the cluster it was taken of (null when it is gone or the
// snapshot is of a network volume).
async function cloneSource(snapshotId) {
  const snap = (await get(`/v1/snapshots/${encodeURIComponent(snapshotId)}`)).data;
  let source = null;
  if (snap.source_cluster_id) {
    try {
      source = (await get(`/v1/clusters/${encodeURIComponent(snap.source_cluster_id)}`)).data;
    } catch {
      source = null;
    }
  }
  return { snap, source };
}

export async function render(main, [snapshotId] = [], opts = {}) {
  const [gpus, volumes, clone, hostImages, templates] = await Promise.all([
    get("/v1/gpu-types").then((a) => a.data.gpu_types),
    // No network volumes to offer (none, or none this key may read) leaves the choice out.
    get("/v1/networkvolumes").then((a) => a.data.network_volumes, () => []),
    snapshotId ? cloneSource(snapshotId) : Promise.resolve(null),
    // The images already on the hosts: they start without a pull (and work offline).
    get("/v1/host-images").then((a) => a.data.images.map((i) => i.name), () => []),
    snapshotId ? Promise.resolve([]) : get("/v1/templates?per_page=200").then((a) => a.data.templates, () => []),
  ]);
  const byId = new Map(gpus.map((g) => [g.id, g]));
  const inp = (name, attrs = {}) => h("input", { name, id: "f-" + name, "data-field": name, ...attrs });
  const gpu = h(
    "select",
    { name: "gpu_type", id: "f-gpu_type", "data-field": "gpu_type" },
    h("option", { value: "" }, "No GPU (CPU only)"),
    gpus.map((g) =>
      h("option", { value: g.id, selected: g.available_gpus > 0 && g === gpus.find((x) => x.available_gpus > 0) },
        `${g.display_name} · ${g.memory_gb} GB · $${g.secure_price} per GPU-hour (spot from $${g.secure_spot_price}) · ${g.available_gpus} of ${g.total_gpus} free`),
    ),
  );
  const count = inp("gpu_count", { type: "number", min: "0", max: "64", value: "1" });
  const cpu = inp("cpu_cores", { type: "number", min: "1", value: "2" });
  const memory = inp("memory_gb", { type: "number", min: "1", value: "4" });
  const disk = inp("container_disk_gb", { type: "number", min: "1", value: "10" });
  const volume = inp("volume_gb", { type: "number", min: "0", value: "0" });
  const networkVolume = h("select", { name: "network_volume_id", id: "f-network_volume_id", "data-field": "network_volume_id" },
    h("option", { value: "" }, "None: a volume of its own"),
    volumes.map((v) => h("option", { value: v.id }, `${v.name} · ${v.size} GB · ${v.dataCenterId}` +
      (v.attached_cluster_ids.length ? ` · mounted by ${v.attached_cluster_ids.length}` : ""))));
  const mountPath = inp("volume_mount_path", { placeholder: "/workspace" });
  const imageList = h("datalist", { id: "host-images", "data-testid": "host-images" }, hostImages.map((n) => h("option", { value: n })));
  const image = inp("docker_image", { required: true, list: "host-images", autocomplete: "off",
    placeholder: hostImages.length ? hostImages[0] : "an image on the hosts, or one to pull" });
  const command = inp("docker_args", { placeholder: "optional: the command to run" });
  const name = inp("name", { placeholder: "optional" });
  const spot = h("input", { type: "checkbox", name: "interruptible", id: "f-interruptible", "data-field": "interruptible" });
  const bid = inp("bid_per_gpu", { type: "number", step: "0.01", min: "0", placeholder: "bid per GPU-hour" });
  const idle = inp("auto_terminate.idle_minutes", { type: "number", min: "1", placeholder: "minutes" });
  const costLimit = inp("auto_terminate.cost_limit_usd", { type: "number", step: "0.01", min: "0", placeholder: "USD" });
  const maxHours = inp("auto_terminate.max_runtime_hours", { type: "number", step: "0.5", min: "0", placeholder: "hours" });
  const atAction = h("select", { "data-field": "auto_terminate.action", "aria-label": "Auto-terminate action" },
    h("option", { value: "stop" }, "stop"), h("option", { value: "terminate" }, "terminate"));
  const env = envEditor();
  const ports = portsEditor();
  const template = h("select", { name: "template_id", id: "f-template_id", "data-field": "template_id" },
    h("option", { value: "" }, "None"),
    templates.map((t) => h("option", { value: t.id }, `${t.name} · ${t.docker_image}`)));
  const estimate = h("output", { class: "estimate", "data-testid": "estimate", "aria-live": "polite" });
  const submit = h("button", { type: "submit", class: "primary", "data-testid": "create-submit" }, "Create cluster");

  const form = h(
    "form",
    { class: "card", novalidate: true },
    h("h1", {}, clone ? "Clone a snapshot" : "New cluster"),
    clone ? h("p", { class: "card notice", "data-testid": "clone-of" },
      `The new cluster's volume starts with snapshot ${clone.snap.name || clone.snap.id} (${clone.snap.id}, ${clone.snap.volume_gb} GB)` +
      (clone.source ? `, taken of ${clone.source.name}.` : ".")) : null,
    templates.length ? field("Template", template, "fills the form; its env, ports and registry credentials apply when left empty here") : null,
    h("div", { class: "grid" },
      field("GPU type", gpu, "price per GPU-hour, spot floor, free right now"),
      field("GPU count", count),
      field("vCPU", cpu),
      field("Memory (GB)", memory),
      field("Container disk (GB)", disk),
      field("Volume (GB)", volume, "kept while stopped, at the mount path"),
      field("Network volume", networkVolume, "instead of a volume of its own; the cluster runs on its host"),
      field("Mount path", mountPath, "default /workspace"),
      field("Image", h("span", {}, image, imageList), hostImages.length ? `${hostImages.length} on the hosts already (no download); type any other to pull it` : "pulled from its registry when not on the host"),
      field("Command", command),
      field("Name", name)),
    env,
    ports,
    h("fieldset", {}, h("legend", {}, "Spot"),
      h("label", { class: "inline" }, spot, " Interruptible (spot): cheaper, may be preempted"),
      field("Bid per GPU-hour", bid)),
    h("fieldset", { "data-field": "auto_terminate", tabindex: "-1" }, h("legend", {}, "Auto-terminate"),
      h("div", { class: "grid" }, field("When idle for (min)", idle), field("When cost reaches", costLimit),
        field("After running (h)", maxHours), field("Then", atAction))),
    h("div", { class: "submit-row" }, estimate, submit),
  );

  function body() {
    const b = {
      docker_image: image.value.trim(),
      cpu_cores: num(cpu.value),
      memory_gb: num(memory.value),
      container_disk_gb: num(disk.value),
      volume_gb: num(volume.value),
      env: env.collect(),
      ports: ports.collect(),
    };
    if (gpu.value) {
      b.gpu_type = gpu.value;
      b.gpu_count = num(count.value);
    } else {
      b.gpu_count = 0;
    }
    if (name.value.trim()) b.name = name.value.trim();
    if (networkVolume.value) {
      b.network_volume_id = networkVolume.value;
      delete b.volume_gb; // the network volume is the volume
    }
    if (mountPath.value.trim()) b.volume_mount_path = mountPath.value.trim();
    if (clone) b.snapshot_id = clone.snap.id;
    if (template.value) {
      b.template_id = template.value;
      // Left empty here: the template's.
      if (!Object.keys(b.env).length) delete b.env;
      if (!b.ports.length) delete b.ports;
    }
    if (command.value.trim()) b.docker_args = command.value.trim();
    if (spot.checked) {
      b.interruptible = true;
      if (bid.value) b.bid_per_gpu = Number(bid.value);
    }
    const at = { idle_minutes: num(idle.value), cost_limit_usd: num(costLimit.value), max_runtime_hours: num(maxHours.value) };
    if (Object.values(at).some((v) => v !== null)) b.auto_terminate = { enabled: true, action: atAction.value, ...at };
    for (const k of Object.keys(b)) if (b[k] === null) delete b[k];
    return b;
  }

  // The GPUs' part at once from the catalog; then the whole rate from the API's quote
  // (the bill's own arithmetic: compute, disks and volume included), the latest
  // form's answer winning.
  let asked = 0;
  let timer = null;
  function updateEstimate() {
    const g = byId.get(gpu.value);
    const n = Number(count.value) || 0;
    const unit = g ? (spot.checked ? Number(bid.value) || g.secure_spot_price : g.secure_price) : 0;
    const gpus = `GPUs ${rate(unit * n)}`;
    estimate.textContent = gpus;
    // Counted at the change, not when the quote is sent: an answer to an older form
    // arriving before this one's request goes out is dropped too.
    const mine = ++asked;
    clearTimeout(timer);
    timer = setTimeout(async () => {
      try {
        const q = (await post("/v1/prices/quote", body())).data;
        if (mine !== asked) return;
        estimate.textContent =
          `${rate(q.hourly.total)} running (${gpus}) · ${rate(q.hourly_stopped.total)} stopped`;
      } catch {
        // An incomplete form: the GPUs' part stands; the create shows the field's error.
      }
    }, 250);
  }

  // A clone starts from the source cluster's shape, and a volume as large as the data.
  if (clone) {
    const c = clone.source;
    volume.value = String(Math.max(clone.snap.volume_gb, c ? c.volume_gb : 0));
    if (c) {
      if (c.gpu_type && byId.has(c.gpu_type)) gpu.value = c.gpu_type;
      else if (!c.gpu_type) gpu.value = "";
      count.value = String(c.gpu_count);
      cpu.value = String(c.cpu_cores);
      memory.value = String(c.memory_gb);
      disk.value = String(c.container_disk_gb);
      image.value = c.docker_image;
      if (c.volume_mount_path) mountPath.value = c.volume_mount_path;
      name.value = `${c.name}-clone`;
    }
  }
  function applyTemplate() {
    const t = templates.find((x) => x.id === template.value);
    if (!t) return;
    image.value = t.docker_image;
    command.value = t.docker_args || "";
    disk.value = String(t.container_disk_gb);
    volume.value = String(t.volume_gb);
    mountPath.value = t.volume_mount_path || "";
  }
  template.addEventListener("change", applyTemplate);
  if (opts.templateId) {
    template.value = opts.templateId;
    applyTemplate();
  }
  networkVolume.addEventListener("change", () => {
    volume.disabled = !!networkVolume.value;
  });

  form.addEventListener("input", updateEstimate);
  form.addEventListener("change", updateEstimate);
  updateEstimate();

  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    clearErrors(form);
    submit.disabled = true;
    try {
      const answer = await post("/v1/clusters", body());
      location.hash = "#/clusters/" + answer.data.id;
    } catch (err) {
      showError(form, err);
    } finally {
      submit.disabled = false;
    }
  });
  main.append(form);
}
