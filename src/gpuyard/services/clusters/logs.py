"""A cluster's logs: its containers' output merged with gpuyard's own events.

``container`` lines come from the cluster's live container (through its host's
runtime) and from the archives of its earlier containers (reconciler/clusters/log_archive.py);
``system`` lines are its events (status changes, restarts, snapshots, moves...). Each
entry carries the stream's cursor after it (core/log_lines.py), its SSE event id.

Every function here blocks (database, engine): call them off the event loop. None
writes. Another account's cluster is CLUSTER_NOT_FOUND, as everywhere. Once a cluster
is terminated its containers and archives are gone: only its system lines remain.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gpuyard.core.errors import GpuyardError
from gpuyard.core.log_lines import (
    Cursor,
    LogLine,
    clip,
    datetime_ns,
    indexed,
    is_after,
    ns_datetime,
    parse_timestamped,
    rfc3339,
)
from gpuyard.core.states import ClusterStatus
from gpuyard.runtimes.base import ContainerState, Runtime
from gpuyard.services.clusters.cluster_rows import load_cluster
from gpuyard.services.context import Context
from gpuyard.services.tenancy.auth import Principal
from gpuyard.store.schema import Cluster, ClusterLogArchive, Event

Source = Literal["container", "system"]
RuntimeOf = Callable[[int | None], Runtime]
# A container that may still write: a follow attaches to it.
_WRITING = {ContainerState.RUNNING, ContainerState.CREATED}


@dataclass(frozen=True)
class LogEntry:
    """One line of the stream and the cursor after it (``id``)."""

    id: str
    source: Source
    ts_ns: int
    line: str

    def as_json(self) -> dict[str, Any]:
        return {"id": self.id, "source": self.source, "line": self.line, "ts": rfc3339(self.ts_ns)}


@dataclass(frozen=True)
class SystemLine:
    """An event as a log line."""

    event_id: int
    ts_ns: int
    text: str


@dataclass
class LogPage:
    """Entries in stream order, the cursor after them (the start cursor when there are
    none), and what a follow needs next."""

    entries: list[LogEntry]
    cursor: Cursor
    status: str
    host_id: int | None
    # Entries after these were left out (the limit): read on from ``cursor``.
    more: bool = False
    # The live container may still write (follow it from ``cursor``).
    writing: bool = False
    # Archived lines stamped ``cursor.ts_ns`` (they count before the live container's).
    archived_at_cursor: int = 0
    # Why the live container's output could not be read (the engine's trouble).
    container_error: str | None = None


def system_text(e: Event) -> str:
    """An event as one system line: ``status: starting -> running (running)``."""
    if e.type == "status" and e.to_status:
        change = f"{e.from_status} -> {e.to_status}" if e.from_status else e.to_status
        return f"status: {change} ({e.message})"
    return f"{e.type}: {e.message}"


def _system(e: Event) -> SystemLine:
    return SystemLine(e.id, datetime_ns(e.created_at), clip(system_text(e)))


@dataclass(frozen=True)
class _Target:
    cluster_id: str
    host_id: int | None
    status: str


def _target(ctx: Context, principal: Principal, cluster_id: str) -> _Target:
    with ctx.read() as session:
        c = load_cluster(session, principal, cluster_id)
        return _Target(c.id, c.host_id, c.status)


@dataclass
class _Live:
    lines: list[LogLine] = field(default_factory=list)
    container_id: str | None = None
    writing: bool = False
    error: str | None = None


def _read_live(
    runtime_of: RuntimeOf,
    t: _Target,
    *,
    tail: int | None,
    since_ns: int | None,
    head: int | None = None,
) -> _Live:
    """The live container's output (the engine first, then the store: an archive made
    meanwhile of the container read here is then recognised by its id)."""
    if t.status == ClusterStatus.TERMINATED.value or t.host_id is None:
        return _Live()
    try:
        runtime = runtime_of(t.host_id)
        seen = runtime.observe(t.cluster_id)
        if seen.state is ContainerState.MISSING:
            return _Live()
        lines = runtime.log_lines(t.cluster_id, tail=tail, since_ns=since_ns, head=head)
    except GpuyardError as exc:
        return _Live(error=exc.message)
    clipped = [LogLine(line.ts_ns, clip(line.text)) for line in lines]
    return _Live(clipped, seen.container_id, seen.state in _WRITING)


def _archives(
    session: Session, t: _Target, live_id: str | None, *, since_ns: int, need: int | None
) -> tuple[list[list[LogLine]], bool]:
    """Archived containers' lines stamped at or after ``since_ns``, oldest container
    first; the newest ones until ``need`` lines (None: all); and whether that is all of
    them. The live container's own archive (made just before it goes) is left out."""
    query = (
        select(ClusterLogArchive)
        .where(ClusterLogArchive.cluster_id == t.cluster_id)
        .order_by(ClusterLogArchive.id.desc())
    )
    if since_ns > 0:
        query = query.where(ClusterLogArchive.last_at >= ns_datetime(since_ns))
    out: list[list[LogLine]] = []
    count = 0
    for row in session.scalars(query):
        if live_id is not None and row.container_id == live_id:
            continue
        lines = [line for line in parse_timestamped(row.text) if line.ts_ns >= since_ns]
        out.append(lines)
        count += len(lines)
        if need is not None and count >= need:
            out.reverse()
            return out, False
    out.reverse()
    return out, True


def _container_lines(
    archives: list[list[LogLine]], live: list[LogLine]
) -> list[tuple[LogLine, int, bool]]:
    """Every container line in stream order with its index among its stamp's lines and
    whether it is archived: archives in order, then the live container, by stamp."""
    tagged = [(line, True) for lines in archives for line in lines]
    tagged += [(line, False) for line in live]
    tagged.sort(key=lambda item: item[0].ts_ns)  # stable: equal stamps keep their order
    positions = indexed([line for line, _ in tagged])
    return [
        (line, index, archived)
        for (line, index), (_, archived) in zip(positions, tagged, strict=True)
    ]


_Item = tuple[int, int, Source, str, int]  # ts, rank, source, text, index or event id


def _merge(
    container: Iterable[tuple[LogLine, int, bool]], system: Iterable[SystemLine]
) -> list[_Item]:
    """Both sources interleaved by stamp, each in its own order (system first on ties)."""
    events: Iterable[_Item] = ((s.ts_ns, 0, "system", s.text, s.event_id) for s in system)
    lines: Iterable[_Item] = ((c.ts_ns, 1, "container", c.text, i) for c, i, _ in container)
    return list(heapq.merge(events, lines, key=lambda item: (item[0], item[1])))


def _advance(cursor: Cursor, item: _Item) -> Cursor:
    ts, _, source, _, ref = item
    return cursor.after_event(ref) if source == "system" else cursor.after_line(ts, ref)


def _entries(start: Cursor, items: Iterable[_Item]) -> tuple[list[LogEntry], Cursor]:
    out: list[LogEntry] = []
    cursor = start
    for item in items:
        cursor = _advance(cursor, item)
        out.append(LogEntry(str(cursor), item[2], item[0], item[3]))
    return out, cursor


def read_tail(
    ctx: Context,
    principal: Principal,
    runtime_of: RuntimeOf,
    cluster_id: str,
    *,
    tail: int,
    since_ns: int = 0,
) -> LogPage:
    """The last ``tail`` entries stamped at or after ``since_ns``, oldest first, and the
    cursor before the first of them (so a follow from there misses nothing).
    Raises ClusterNotFound."""
    t = _target(ctx, principal, cluster_id)
    # One more of each source than shown: the one left out says where the window starts.
    live = _read_live(runtime_of, t, tail=tail + 1, since_ns=since_ns or None)
    with ctx.read() as session:
        archived, every_archive = _archives(
            session, t, live.container_id, since_ns=since_ns, need=tail + 1
        )
        query = select(Event).where(Event.cluster_id == cluster_id)
        floor = 0
        if since_ns > 0:
            since = ns_datetime(since_ns)
            query = query.where(Event.created_at >= since)
            floor = (
                session.scalar(
                    select(func.max(Event.id)).where(
                        Event.cluster_id == cluster_id, Event.created_at < since
                    )
                )
                or 0
            )
        recent = list(session.scalars(query.order_by(Event.id.desc()).limit(tail + 1)))
    system = [_system(e) for e in reversed(recent)]
    container = _container_lines(archived, live.lines)
    merged = _merge(container, system)
    cut = max(len(merged) - tail, 0)
    # Every container line since since_ns loaded: the start is since_ns itself (the
    # cursor read_after gives for the same place); else the first line loaded.
    complete = every_archive and len(live.lines) <= tail
    start = Cursor(container[0][0].ts_ns if container and not complete else since_ns, 0, floor)
    for item in merged[:cut]:
        start = _advance(start, item)
    entries, cursor = _entries(start, merged[cut:])
    archived_at = sum(1 for line, _, arch in container if arch and line.ts_ns == cursor.ts_ns)
    return LogPage(
        entries,
        start if not entries else cursor,
        t.status,
        t.host_id,
        writing=live.writing,
        archived_at_cursor=archived_at,
        container_error=live.error,
    )


def read_after(
    ctx: Context,
    principal: Principal,
    runtime_of: RuntimeOf,
    cluster_id: str,
    cursor: Cursor,
    *,
    limit: int,
) -> LogPage:
    """The entries after ``cursor``, oldest first, at most ``limit`` (``more`` says
    whether others follow). Raises ClusterNotFound."""
    t = _target(ctx, principal, cluster_id)
    # The lines of the cursor's stamp it has passed, then one more than a page: never
    # the container's whole output.
    head = cursor.n + limit + 1
    live = _read_live(runtime_of, t, tail=None, since_ns=cursor.ts_ns or None, head=head)
    with ctx.read() as session:
        archived, _ = _archives(session, t, live.container_id, since_ns=cursor.ts_ns, need=None)
        events = session.scalars(
            select(Event)
            .where(Event.cluster_id == cluster_id, Event.id > cursor.event_id)
            .order_by(Event.id)
            .limit(limit + 1)
        ).all()
    container = _container_lines(archived, live.lines)
    fresh = [c for c in container if is_after(c[0].ts_ns, c[1], cursor)]
    merged = _merge(fresh, [_system(e) for e in events])
    entries, end = _entries(cursor, merged[:limit])
    archived_at = sum(1 for line, _, arch in container if arch and line.ts_ns == end.ts_ns)
    return LogPage(
        entries,
        end,
        t.status,
        t.host_id,
        more=len(merged) > limit,
        writing=live.writing,
        archived_at_cursor=archived_at,
        container_error=live.error,
    )


def events_after(
    ctx: Context, cluster_id: str, event_id: int, limit: int
) -> tuple[str, list[SystemLine]]:
    """The cluster's status and its events after ``event_id`` (at most ``limit``), for
    a follow that has checked access already. A cluster gone reads as terminated."""
    with ctx.read() as session:
        status = session.scalar(select(Cluster.status).where(Cluster.id == cluster_id))
        events = session.scalars(
            select(Event)
            .where(Event.cluster_id == cluster_id, Event.id > event_id)
            .order_by(Event.id)
            .limit(limit)
        ).all()
    return status or ClusterStatus.TERMINATED.value, [_system(e) for e in events]


def system_entry(cursor: Cursor, line: SystemLine) -> tuple[LogEntry, Cursor]:
    """The entry of a system line delivered after ``cursor``, and the cursor after it."""
    after = cursor.after_event(line.event_id)
    return LogEntry(str(after), "system", line.ts_ns, line.text), after


def container_entry(after: Cursor, line: LogLine) -> LogEntry:
    """The entry of a container line whose cursor (after it) is ``after``."""
    return LogEntry(str(after), "container", line.ts_ns, clip(line.text))
