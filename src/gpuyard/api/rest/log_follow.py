"""``GET /v1/clusters/{id}/logs?follow=true``: the Server-Sent Events stream.

After the first page (the tail, or what follows ``Last-Event-ID``) the stream goes on:

- while the cluster's container runs, its output is read as it is written on a thread
  of its own (:class:`_Follower`; the engine's follow blocks) and handed to the event
  loop through a bounded buffer, so a slow client slows the read, never the server's
  memory; events are polled every :data:`POLL_S`;
- when that container stops or is replaced, or while there is none, the stream catches
  up through services/clusters/logs.py ``read_after`` (archives, a new container, events)
  and attaches again;
- a terminated cluster ends the stream with an ``end`` event;
- so does the end of the caller's access (the key revoked, the membership removed or
  narrowed): re-checked every few seconds (api/http/access_watch.py), the stream then
  sends ``end`` with ``{"status":"access_ended"}`` and closes.

Each entry is sent with its cursor as the SSE ``id``, so a client that reconnects with
``Last-Event-ID`` gets exactly what it missed. A comment line every
:data:`HEARTBEAT_S` keeps proxies from closing a quiet stream. When the client goes,
the engine stream is closed and the thread ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator

import anyio
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.concurrency import run_in_threadpool

from gpuyard.api.http.access_watch import access_ended
from gpuyard.api.state import AppState
from gpuyard.core.errors import GpuyardError
from gpuyard.core.log_lines import MAX_TAIL, Cursor, LivePositioner, LogLine
from gpuyard.core.states import ClusterStatus
from gpuyard.runtimes.base import Runtime
from gpuyard.services.clusters import logs as svc
from gpuyard.services.tenancy.auth import Principal
from gpuyard.services.tenancy.cluster_access import Need

log = logging.getLogger(__name__)

HEARTBEAT_S = 15.0
# How often events are looked for, and a stopped cluster's container.
POLL_S = 1.0
# With no container to follow, look for one (a start) this often at least.
REATTACH_S = 5.0
# Lines read ahead of a slow client before the engine read waits.
BUFFER_LINES = 2000
SEP = "\n"
# On shutdown a stream ends at its next look (within POLL_S); past this it is cut.
SHUTDOWN_GRACE_S = 3.0


class _Follower:
    """One container's output, followed on a daemon thread and taken on the loop."""

    def __init__(self, runtime: Runtime, cluster_id: str, since_ns: int | None) -> None:
        self._loop = asyncio.get_running_loop()
        self._runtime = runtime
        self._cluster_id = cluster_id
        self._since_ns = since_ns
        self._lines: deque[LogLine] = deque()
        self._cond = threading.Condition()
        self._wake = asyncio.Event()
        self._closed = False
        self._stream: object | None = None
        self.done = False
        self._thread = threading.Thread(target=self._run, name=f"logs-{cluster_id}", daemon=True)
        self._thread.start()

    def _signal(self) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody is waiting
            self._loop.call_soon_threadsafe(self._wake.set)

    def _run(self) -> None:
        try:
            follow = self._runtime.follow_log(self._cluster_id, since_ns=self._since_ns)
            with self._cond:
                self._stream = follow
                if self._closed:
                    follow.close()
            for line in follow:
                with self._cond:
                    while len(self._lines) >= BUFFER_LINES and not self._closed:
                        self._cond.wait(0.5)
                    if self._closed:
                        break
                    self._lines.append(line)
                self._signal()
        except GpuyardError as exc:
            log.debug("following the logs of %s ended: %s", self._cluster_id, exc.code)
        finally:
            self.done = True
            self._signal()

    def take(self) -> list[LogLine]:
        """The lines read so far (on the loop)."""
        with self._cond:
            lines = list(self._lines)
            self._lines.clear()
            self._cond.notify_all()
        return lines

    async def wait(self, timeout_s: float) -> None:
        """Until lines arrive, the follow ends or ``timeout_s`` passes."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout_s)
        self._wake.clear()

    def close(self) -> None:
        """Stop reading: close the engine stream (the thread then ends). Idempotent."""
        with self._cond:
            self._closed = True
            stream = self._stream
            self._cond.notify_all()
        close = getattr(stream, "close", None)
        if callable(close):
            close()


def _sse(entry: svc.LogEntry) -> ServerSentEvent:
    body = {"source": entry.source, "line": entry.line, "ts": entry.as_json()["ts"]}
    data = json.dumps(body, ensure_ascii=False, separators=(",", ":"))
    return ServerSentEvent(data=data, id=entry.id, sep=SEP)


class _Stream:
    """The state of one follow: the cursor and what the last read said."""

    def __init__(
        self,
        state: AppState,
        principal: Principal,
        cluster_id: str,
        source: svc.Source | None = None,
        follow: bool = True,
    ) -> None:
        self.state = state
        self.principal = principal
        self.cluster_id = cluster_id
        # Only this source's entries are sent (None: both); ``follow``: go on after the
        # first page (else the stream ends with it).
        self.source = source
        self.keep_following = follow
        # Set when the server shuts down: the stream then ends cleanly (the client
        # reconnects with Last-Event-ID to whichever server answers next).
        self.shutdown = anyio.Event()
        # Set when the caller may no longer read the cluster: the stream ends.
        self.revoked = False
        self.page: svc.LogPage | None = None
        self.cursor = Cursor()

    def stopped(self) -> bool:
        return self.shutdown.is_set() or self.revoked

    def take(self, page: svc.LogPage) -> list[ServerSentEvent]:
        self.page, self.cursor = page, page.cursor
        return [_sse(e) for e in page.entries]

    async def catch_up(self) -> list[ServerSentEvent]:
        page = await run_in_threadpool(
            svc.read_after,
            self.state.ctx,
            self.principal,
            self.state.runtime_of,
            self.cluster_id,
            self.cursor,
            limit=MAX_TAIL,
        )
        return self.take(page)

    async def events(self) -> tuple[str, list[ServerSentEvent]]:
        status, lines = await run_in_threadpool(
            svc.events_after, self.state.ctx, self.cluster_id, self.cursor.event_id, MAX_TAIL
        )
        out = []
        for line in lines:
            entry, self.cursor = svc.system_entry(self.cursor, line)
            out.append(_sse(entry))
        return status, out

    async def follow(self, page: svc.LogPage) -> AsyncIterator[ServerSentEvent]:
        """The live container's new lines and new events, until it stops."""
        # Finding a host's runtime may read the store or open a tunnel: off the loop.
        runtime = await run_in_threadpool(self.state.runtime_of, page.host_id)
        positioner = LivePositioner(self.cursor, page.archived_at_cursor)
        follower = _Follower(runtime, self.cluster_id, self.cursor.ts_ns or None)
        try:
            next_poll = time.monotonic() + POLL_S
            finished = False
            while not finished and not self.stopped():
                await follower.wait(POLL_S)
                # Read before taking: every line the thread added before it ended is taken.
                finished = follower.done
                for line in follower.take():
                    index = positioner.admit(line)
                    if index is not None:
                        self.cursor = self.cursor.after_line(line.ts_ns, index)
                        yield _sse(svc.container_entry(self.cursor, line))
                if time.monotonic() >= next_poll:
                    next_poll = time.monotonic() + POLL_S
                    _, sent = await self.events()
                    for event in sent:
                        yield event
        finally:
            follower.close()

    async def idle(self) -> AsyncIterator[ServerSentEvent]:
        """No container to follow: new events, until one comes or :data:`REATTACH_S`."""
        deadline = time.monotonic() + REATTACH_S
        while time.monotonic() < deadline and not self.stopped():
            await asyncio.sleep(POLL_S)
            status, sent = await self.events()
            for event in sent:
                yield event
            if sent or status == ClusterStatus.TERMINATED.value:
                return

    async def _watch(self) -> None:
        await access_ended(self.state, self.principal, self.cluster_id, Need.READ)
        self.revoked = True

    def _kept(self, event: ServerSentEvent) -> bool:
        if self.source is None or event.event is not None or not isinstance(event.data, str):
            return True
        return bool(json.loads(event.data).get("source") == self.source)

    async def run(self, first: svc.LogPage) -> AsyncIterator[ServerSentEvent]:
        watch = asyncio.create_task(self._watch())
        inner = self._run(first)
        try:
            async for event in inner:
                if self.revoked:
                    break
                if self._kept(event):
                    yield event
            if self.revoked:
                yield ServerSentEvent(data='{"status":"access_ended"}', event="end", sep=SEP)
        finally:
            watch.cancel()
            await inner.aclose()  # the engine follow is closed now, not when collected

    async def _run(self, first: svc.LogPage) -> AsyncGenerator[ServerSentEvent, None]:
        for event in self.take(first):
            yield event
        if not self.keep_following:
            return
        try:
            while not self.stopped():
                page = self.page
                assert page is not None
                if not page.more:
                    if page.status == ClusterStatus.TERMINATED.value:
                        yield ServerSentEvent(data='{"status":"terminated"}', event="end", sep=SEP)
                        return
                    began = time.monotonic()
                    live = self.follow(page) if page.writing else self.idle()
                    async for event in live:
                        yield event
                    if time.monotonic() - began < POLL_S:
                        # The engine ended the follow at once: do not spin on it.
                        await asyncio.sleep(POLL_S)
                for event in await self.catch_up():
                    yield event
        except GpuyardError as exc:
            # The cluster went (or the store failed): the client reconnects or stops.
            log.debug("log stream of %s ended: %s", self.cluster_id, exc.code)


def respond(
    state: AppState,
    principal: Principal,
    cluster_id: str,
    first: svc.LogPage,
    *,
    source: svc.Source | None = None,
    follow: bool = True,
) -> EventSourceResponse:
    """The SSE answer that starts with ``first`` (already read: a missing cluster has
    answered 404 before any stream begins). ``source``: only that source's entries;
    ``follow=False``: only ``first``'s, then the stream ends."""
    stream = _Stream(state, principal, cluster_id, source, follow)
    return EventSourceResponse(
        stream.run(first),
        shutdown_event=stream.shutdown,
        shutdown_grace_period=SHUTDOWN_GRACE_S,
        ping=int(HEARTBEAT_S),
        ping_message_factory=lambda: ServerSentEvent(comment="keep-alive", sep=SEP),
        sep=SEP,
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
