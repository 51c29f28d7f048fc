// Polling that is kind to the server: one request at a time, every `intervalMs`
// (never under 3 s), paused while the tab is hidden, with If-None-Match when the
// API gave an ETag. `fetchOnce(etag)` answers {etag, notModified} from api().

export function poll(fetchOnce, intervalMs = 4000) {
  const every = Math.max(3000, intervalMs);
  let timer = null;
  let stopped = false;
  let etag = null;
  let running = false;

  async function tick() {
    timer = null;
    if (stopped || document.hidden || running) return;
    running = true;
    try {
      const answer = await fetchOnce(etag);
      if (answer && answer.etag) etag = answer.etag;
    } catch (err) {
      console.warn("poll failed", err);
    } finally {
      running = false;
      if (!stopped && !document.hidden) timer = setTimeout(tick, every);
    }
  }

  function onVisibility() {
    if (document.hidden) {
      if (timer) clearTimeout(timer);
      timer = null;
    } else if (!timer && !running) {
      tick();
    }
  }

  document.addEventListener("visibilitychange", onVisibility);
  tick();
  return {
    now() {
      if (timer) clearTimeout(timer);
      tick();
    },
    stop() {
      stopped = true;
      if (timer) clearTimeout(timer);
      document.removeEventListener("visibilitychange", onVisibility);
    },
  };
}
