// One endpoint: its settings, what its workers and queue are doing (the endpoint's
// own counts and RunPod's health answer, GET /runpod/v2/{id}/health), a box that sends
// a request (POST /runpod/v2/{id}/runsync) and shows the answer, and delete.
import { api, del, get } from "../api.js";
import { poll } from "../poll.js";
import { session } from "../session.js";
import { clear, flash, h } from "../ui.js";
import { countsText } from "./endpoints.js";

function rows(pairs) {
  return h("dl", { class: "kv" }, ...pairs.flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v == null || v === "" ? "—" : String(v))]));
}

export async function render(main, [id]) {
  const facts = h("div", { "data-testid": "endpoint-facts" });
  const now = h("p", { "data-testid": "endpoint-counts" });
  const health = h("p", { "data-testid": "endpoint-health", class: "muted" }, "health: —");
  const input = h("textarea", { name: "input", "data-field": "input", rows: 5 }, '{"prompt": "hello"}');
  const answer = h("pre", { "data-testid": "send-answer", class: "muted" });
  const send = h("button", { type: "submit", class: "primary" }, "Send");
  const box = h("form", { class: "card", "data-testid": "send-box" }, h("h2", {}, "Send a request"),
    h("p", { class: "muted" }, "The JSON below is the job's input; the answer is runsync's (output, delayTime, executionTime)."),
    input, h("div", { class: "actions" }, send), answer);
  const title = h("h1", {}, "Endpoint");
  const remove = h("button", { type: "button", class: "danger", "data-testid": "delete-endpoint" }, "Delete");
  main.append(title, h("p", {}, h("a", { href: "#/endpoints" }, "All endpoints")), facts, now, health,
    session.canWrite ? box : null, session.canWrite ? remove : null);

  function show(e) {
    title.textContent = `Endpoint ${e.name}`;
    clear(facts).append(rows([
      ["id", e.id], ["status", e.status], ["version", e.version], ["image", e.image], ["template", e.template_id],
      ["GPUs", `${e.gpu_count} × ${e.gpu_type_ids.join(", ") || "none"}`],
      ["workers", `${e.workers_min}..${e.workers_max}`], ["scaler", `${e.scaler_type} ${e.scaler_value}`],
      ["idle timeout", `${e.idle_timeout_s} s`], ["execution timeout", `${e.execution_timeout_ms} ms`],
      ["flashboot", e.flashboot ? "on" : "off"], ["locations", e.locations.join(", ")],
      ["network volume", e.network_volume_id], ["capacity problem", e.capacity_problem],
    ]));
    now.textContent = countsText(e);
  }

  async function refresh(etag) {
    const got = await get(`/v1/endpoints/${id}`, { etag });
    if (!got.notModified) show(got.data);
    try {
      const hb = (await api("GET", `/runpod/v2/${id}/health`)).body;
      health.textContent = `health: ${hb.jobs.completed} completed · ${hb.jobs.failed} failed · ${hb.jobs.retried} retried · ${hb.jobs.inQueue} queued · ${hb.jobs.inProgress} in progress · workers ${hb.workers.idle} idle, ${hb.workers.running} running`;
    } catch {
      health.textContent = "health: not available";
    }
    return got;
  }

  box.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    let value;
    try {
      value = JSON.parse(input.value);
    } catch (err) {
      answer.textContent = `not JSON: ${err.message}`;
      return;
    }
    send.disabled = true;
    answer.textContent = "waiting for the answer…";
    try {
      const got = await api("POST", `/runpod/v2/${id}/runsync`, { input: value });
      answer.textContent = JSON.stringify(got.body, null, 2);
    } catch (err) {
      answer.textContent = `${err.code || "error"}: ${err.message}`;
    } finally {
      send.disabled = false;
    }
  });

  remove.addEventListener("click", async () => {
    if (!window.confirm("Delete this endpoint? It takes no new requests; its workers finish their jobs and stop.")) return;
    try {
      await del(`/v1/endpoints/${id}`);
      flash("endpoint deleted");
      location.hash = "#/endpoints";
    } catch (err) {
      flash(err.message, "error");
    }
  });

  await refresh(null);
  const poller = poll(refresh, 4000);
  return () => poller.stop();
}
