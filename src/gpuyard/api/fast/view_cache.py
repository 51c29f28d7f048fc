"""The rendered ``data`` of recent ``GET /v1/clusters/{id}`` and ``GET /v1/clusters``
answers, briefly kept.

Clients poll these routes, often many at once for the same cluster or list; rendering
(the row, hosts, GPU types, the rate, the accrual, JSON) costs several times what the
HTTP exchange does. An entry answers later requests for the same cluster and account
without any read, on the event loop, for as long as nothing it was made from can have
changed:

- **this process's writes**: every commit on the store's engine bumps a generation
  (before the database commits, and again after a session's commit has landed);
  an entry made from a read that began before the latest commit is not used. The
  generation is taken *before* the read, so a commit racing the read makes the entry
  stale at once rather than hiding the commit;
- **writes of other processes** (the CLI on the same SQLite file, other replicas on a
  shared PostgreSQL) and **time** (the accrued cost, the next auto-termination): an
  entry is used for at most ``max_age_s`` of monotonic time and of the context's clock
  (a test's fake clock moved on makes it stale), so an answer is never older than a
  read that took ``max_age_s`` longer;
- **state kept in memory, not in the store** (when the cluster was last seen idle, and
  whether the HTTP proxy serves): the values an entry was made with are part of it, and
  an entry whose values differ from the current ones is not used.

Who may see the cluster is not cached: the entry is per account (the read only finds
clusters of the caller's account) and keeps the cluster's project, which each request
checks against its own principal (a list's key names the caller's project scope
instead: a list is rendered for what its caller may see). Errors (an unknown cluster,
a bad cursor) are never kept.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Engine, event
from sqlalchemy.orm import Session, sessionmaker

# Far below any client's polling interval and the resolution of what is shown (whole
# seconds of uptime, costs of a second's usage); far above the time between requests
# of a polled cluster under load, so nearly every one of them is a hit.
DEFAULT_MAX_AGE_S = 0.1
# Entries kept at most (one per polled cluster and account); past it all are dropped.
DEFAULT_SIZE = 4096


@dataclass(frozen=True)
class Rendered:
    """One answer's data: the cluster's project (to check each caller's project
    restriction) and its ``data`` as UTF-8 JSON."""

    project_id: int
    data: bytes


@dataclass(frozen=True)
class Stamp:
    """When a read began: the commit generation, monotonic time and clock time."""

    generation: int
    mono: float
    at: datetime


@dataclass(frozen=True)
class _Entry:
    stamp: Stamp
    marks: Hashable
    rendered: Rendered


class ViewCache:
    """Rendered answers by ``(subject, account_id)``; thread-safe. The subject names
    what was rendered: a cluster id, or a list's canonical query (``list?...``).

    Use: ``stamp()`` before reading, then ``put(..., stamp)``; later
    ``get`` answers the entry while it is valid (see the module docstring), else None.
    ``now`` is the context's clock; ``monotonic`` is injectable for tests.
    """

    def __init__(
        self,
        now: Callable[[], datetime],
        *,
        max_age_s: float = DEFAULT_MAX_AGE_S,
        size: int = DEFAULT_SIZE,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._now = now
        self._monotonic = monotonic
        self.max_age_s = max_age_s
        self._size = size
        self._lock = threading.Lock()
        self._generation = 0
        self._entries: dict[tuple[str, int], _Entry] = {}

    def watch(self, engine: Engine, sessions: sessionmaker[Session] | None = None) -> None:
        """Count every commit on ``engine`` (all of this process's writes), and once
        more after each commit of ``sessions`` has landed: the engine's event comes
        before the database commits, so a read stamped between the two could see the
        state before the write; the second count makes what it rendered stale."""
        event.listen(engine, "commit", self._committed)
        if sessions is not None:
            event.listen(sessions, "after_commit", self._committed)

    def _committed(self, _source: object) -> None:
        self.invalidate()

    def invalidate(self) -> None:
        """Something may have changed: no entry made before now is used again."""
        with self._lock:
            self._generation += 1

    @property
    def generation(self) -> int:
        """How many commits (and invalidations) this cache has seen: unchanged between
        two moments, nothing was written in between."""
        return self._generation

    def stamp(self) -> Stamp:
        """Take this before the read an entry is made from."""
        return Stamp(self._generation, self._monotonic(), self._now())

    def get(self, subject: str, account_id: int, marks: Hashable) -> Rendered | None:
        """The entry for this subject and account if still valid with ``marks`` (the
        in-memory inputs of the view now), else None."""
        entry = self._entries.get((subject, account_id))
        if entry is None:
            return None
        made = entry.stamp
        if made.generation != self._generation or entry.marks != marks:
            return None
        if not 0 <= self._monotonic() - made.mono < self.max_age_s:
            return None
        if not 0 <= (self._now() - made.at).total_seconds() < self.max_age_s:
            return None
        return entry.rendered

    def put(
        self,
        subject: str,
        account_id: int,
        marks: Hashable,
        rendered: Rendered,
        stamp: Stamp,
    ) -> None:
        """Keep ``rendered``, made with ``marks`` from a read begun at ``stamp``.
        Ignored when a commit came since (it would be stale at once)."""
        with self._lock:
            if stamp.generation != self._generation:
                return
            if len(self._entries) >= self._size:
                self._entries.clear()
            self._entries[(subject, account_id)] = _Entry(stamp, marks, rendered)
