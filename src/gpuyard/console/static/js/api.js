// The one way the console talks to gpuyard: the public API, same origin, with the
// session cookie (sent by the browser, HttpOnly) and the session's CSRF token.
// Every failure becomes an ApiError carrying the envelope's code, message and field.

const CSRF_KEY = "gpuyard.csrf";

export class ApiError extends Error {
  constructor(status, code, message, details) {
    super(message);
    this.status = status;
    this.code = code;
    this.details = details || {};
  }
  // The request field the API named (e.g. "memory_gb", "ports[0].internal_port").
  get field() {
    return this.details.field || null;
  }
}

export function csrfToken() {
  return localStorage.getItem(CSRF_KEY);
}

export function setCsrfToken(token) {
  if (token) localStorage.setItem(CSRF_KEY, token);
  else localStorage.removeItem(CSRF_KEY);
}

function headers(extra) {
  const h = { Accept: "application/json", ...extra };
  const token = csrfToken();
  if (token) h["X-CSRF-Token"] = token;
  return h;
}

async function failure(response) {
  let body = null;
  try {
    body = await response.json();
  } catch {
    body = null;
  }
  // RFC 9457 problem details (RunPod's REST v2 and job API under /runpod/v2).
  if (body && typeof body.code === "string" && "title" in body) return new ApiError(response.status, body.code, body.detail || body.title, body);
  const err = body && (body.error || (Array.isArray(body.errors) && body.errors[0]));
  if (err && err.code) return new ApiError(response.status, err.code, err.message, err.details);
  // The training API's envelope (seed 002): {code, data, errors: {code, details, field}, message}.
  const t = body && body.errors && !Array.isArray(body.errors) ? body.errors : null;
  if (t && t.code) return new ApiError(response.status, t.code, body.message, { ...(t.details || {}), field: t.field || null });
  return new ApiError(response.status, "HTTP_" + response.status, response.statusText || "request failed");
}

// A read that fails on the network (the connection dropped, or the browser saw its
// network change and cut every request in flight) is asked again, twice at most; a
// write is not, since it may have been done.
const READ_RETRIES = 2;
const RETRY_MS = 300;

async function send(path, init) {
  for (let attempt = 0; ; attempt++) {
    try {
      return await fetch(path, init);
    } catch (err) {
      const read = init.method === "GET" || init.method === "HEAD";
      if (!read || attempt >= READ_RETRIES || err.name === "AbortError") throw err;
      await new Promise((resolve) => setTimeout(resolve, RETRY_MS * (attempt + 1)));
    }
  }
}

// Request `path` (starting /v1/..., the training API's /distributed_jobs_v2/... or
// RunPod's /runpod/v2/...).
// Answers {data, meta, pagination, status, etag} (`pagination`: the training list's,
// outside its data); with
// opts.etag a 304 answers {notModified: true}. Throws ApiError. A 401 also tells
// the page (event "gpuyard:signed-out") unless opts.quiet.
export async function api(method, path, body, opts = {}) {
  const extra = {};
  if (body !== undefined) extra["Content-Type"] = "application/json";
  if (opts.etag) extra["If-None-Match"] = opts.etag;
  const response = await send(path, {
    method,
    headers: headers(extra),
    body: body === undefined ? undefined : JSON.stringify(body),
    credentials: "same-origin",
    signal: opts.signal,
  });
  if (response.status === 304) return { notModified: true, status: 304, etag: opts.etag };
  if (!response.ok) {
    const error = await failure(response);
    if (response.status === 401 && !opts.quiet) {
      window.dispatchEvent(new CustomEvent("gpuyard:signed-out"));
    }
    throw error;
  }
  const json = await response.json();
  return {
    // `body`: the whole answer, for APIs without the envelope (RunPod's job API).
    body: json,
    data: json.data,
    meta: json.meta || {},
    pagination: json.pagination || null,
    status: response.status,
    etag: response.headers.get("ETag"),
  };
}

export const get = (path, opts) => api("GET", path, undefined, opts);
export const post = (path, body, opts) => api("POST", path, body === undefined ? {} : body, opts);
export const del = (path, opts) => api("DELETE", path, undefined, opts);
export const patch = (path, body, opts) => api("PATCH", path, body, opts);
export const put = (path, body, opts) => api("PUT", path, body, opts);

// Server-Sent Events over fetch (EventSource cannot send the CSRF header). Calls
// onEvent({event, data, id}) per event until `signal` aborts or the stream ends.
export async function streamEvents(path, onEvent, signal) {
  const response = await send(path, {
    method: "GET",
    headers: headers({ Accept: "text/event-stream" }),
    credentials: "same-origin",
    signal,
  });
  if (!response.ok) throw await failure(response);
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value.replace(/\r\n/g, "\n");
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      const ev = { event: "message", data: "", id: null };
      for (const line of block.split("\n")) {
        if (line.startsWith(":")) continue;
        const i = line.indexOf(":");
        const name = i < 0 ? line : line.slice(0, i);
        const val = i < 0 ? "" : line.slice(i + 1).replace(/^ /, "");
        if (name === "data") ev.data += (ev.data ? "\n" : "") + val;
        else if (name === "event") ev.event = val;
        else if (name === "id") ev.id = val;
      }
      if (ev.data) onEvent(ev);
    }
  }
}
