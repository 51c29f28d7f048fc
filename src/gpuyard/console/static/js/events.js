// The newest events of a cluster from GET /v1/clusters/{id}/events, which lists them
// oldest first, a keyset page at a time. The first read jumps near the end by offset
// (the answer's total says where), then follows `next_cursor`; the last cursor seen
// is kept, so each later poll reads only the events after it (an index range), never
// the whole history again. The last page has no cursor, so a poll re-reads at most
// one page (PAGE events) past the kept cursor.
import { get } from "./api.js";

const PAGE = 50;

// A reader of the newest `keep` events of cluster `id`: `read()` answers them,
// oldest first, after as few requests as the history allows (1 while it has at most
// PAGE events, or once the cursor is kept).
export function newestEvents(id, keep = PAGE) {
  let anchor = null; // the latest next_cursor seen: the events after it are the news
  let anchorEtag = null; // the ETag of the page after `anchor` as last read: a 304 is no news
  let held = []; // the newest `keep` events read so far, oldest first

  const url = (params) => `/v1/clusters/${encodeURIComponent(id)}/events?` + new URLSearchParams({ per_page: String(PAGE), ...params });

  function merge(events) {
    const byId = new Map(held.map((e) => [e.id, e]));
    for (const e of events) byId.set(e.id, e);
    held = [...byId.values()].sort((a, b) => a.id - b.id).slice(-keep);
  }

  async function follow(answer) {
    merge(answer.data.events);
    let cursor = answer.data.pagination.next_cursor;
    while (cursor) {
      anchor = cursor;
      const next = await get(url({ cursor }));
      anchorEtag = next.etag;
      merge(next.data.events);
      cursor = next.data.pagination.next_cursor;
    }
  }

  async function fromStart() {
    anchorEtag = null;
    const first = await get(url({}));
    const total = first.data.pagination.total;
    // More than two pages: the page before the last one (offset) is the first that
    // holds any of the newest PAGE; its cursor leads to the rest.
    const near = Math.ceil(total / PAGE) - 1;
    if (near > 1) {
      held = [];
      await follow(await get(url({ page: String(near) })));
    } else {
      await follow(first);
    }
  }

  return {
    async read() {
      if (anchor === null) {
        await fromStart();
        return held;
      }
      try {
        const answer = await get(url({ cursor: anchor }), { etag: anchorEtag });
        if (answer.notModified) return held; // nothing after the anchor has changed
        anchorEtag = answer.etag;
        await follow(answer); // a full page moves the anchor on (and its tag with it)
      } catch (err) {
        // A cursor the server no longer takes (another installation's secret, a
        // changed format): start over from the total.
        if (err.status !== 400) throw err;
        anchor = null;
        await fromStart();
      }
      return held;
    },
  };
}
