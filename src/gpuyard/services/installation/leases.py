"""Duty leases: which API replica owns each background duty right now.

Several ``gpuyard serve`` processes on one database each run a reconciler; every duty
(``host:<id>``: a host's heartbeat, observation and the clusters on it; ``autoterm``,
``training``, ``maintenance``) must be done by one of them at a time. A duty's owner
is the ``holder`` of its row in ``leases`` until ``expires_at``; the owner renews it
while it works, and when it dies (kill -9, a lost network) the row expires and another
replica takes it over. ``fence`` grows by one with every change of holder, so work
can be stamped with the hold it was done under.

Correctness rests on the database, never on process memory:

- taking or renewing a lease is one guarded upsert (``INSERT ... ON CONFLICT (name)
  DO UPDATE ... WHERE leases.holder = :me OR leases.expires_at < now``), atomic on
  PostgreSQL (the conflicting row is locked and the condition re-checked on its latest
  version) and on SQLite (write transactions hold the database's write lock,
  store/db.py): of any number of replicas racing for a free lease exactly one gets it;
- on PostgreSQL expiry is judged by the database's clock (``now()``), so the replicas'
  clocks may disagree; on SQLite (one process per database file) by ``ctx.clock``;
- a replica believes it holds a lease for at most a third of the lease time after the
  start of the write that confirmed it, then confirms again; that start comes before
  the database's ``now()`` of that write, so the belief ends well before the row
  expires, also for a replica that was paused or lost the database meanwhile.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import (
    ColumnElement,
    Engine,
    Interval,
    case,
    func,
    literal,
    or_,
    select,
    type_coerce,
    update,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import SQLAlchemyError

from gpuyard.services.context import Context
from gpuyard.services.installation.replica import replica_id
from gpuyard.store.schema import Lease, UtcDateTime

log = logging.getLogger(__name__)

# Local seconds that only ever grow (time.monotonic); injectable for tests.
Monotonic = Callable[[], float]

# What a released lease expires at: long past on every clock.
_RELEASED_AT = datetime(1970, 1, 1, tzinfo=UTC)
_HOLDER_MAX = 100  # leases.holder is String(100)


@dataclass
class _Hold:
    fence: int
    # Local time at the start of the write that last confirmed the hold.
    confirmed_at: float


class LeaseKeeper:
    """This replica's leases. ``holder``: a unique id per process (services/installation/replica.py
    ``replica_id``); ``ttl_s``: how long a lease lasts unless renewed (after a holder's
    death, about the longest its duties go undone); ``clock``: local monotonic seconds
    (the cache's clock, never compared with the database's). Thread-safe: the
    reconciler's loop and its workers may ask at once."""

    def __init__(
        self,
        ctx: Context,
        holder: str,
        ttl_s: float = 15.0,
        clock: Monotonic = time.monotonic,
    ) -> None:
        if not 0 < len(holder) <= _HOLDER_MAX:
            raise ValueError(f"holder must be 1 to {_HOLDER_MAX} characters")
        if ttl_s <= 0:
            raise ValueError("ttl_s must be positive")
        self.ctx = ctx
        self.holder = holder
        self.ttl_s = ttl_s
        self._clock = clock
        bind = ctx.sessions.kw["bind"]
        assert isinstance(bind, Engine)
        self._postgres = bind.dialect.name == "postgresql"
        self._lock = threading.Lock()
        self._name_locks: dict[str, threading.Lock] = {}
        self._held: dict[str, _Hold] = {}
        # Leases another replica holds: until when (local time) not to ask again.
        self._busy_until: dict[str, float] = {}

    @classmethod
    def for_replica(cls, ctx: Context) -> LeaseKeeper:
        """A keeper for this process with a new replica id and the configured lease
        time (``GPUYARD_LEASE_TTL_S``)."""
        return cls(ctx, replica_id(), ctx.settings.lease_ttl_s)

    # -- public --------------------------------------------------------------------
    def holds(self, name: str) -> bool:
        """True if this replica holds lease ``name`` now: acquired when it is free or
        expired, renewed once a third of the lease time has passed since it was last
        confirmed (no database access before that). A lease another replica holds is
        asked for again when it would expire, or after a third of the lease time if
        sooner. One short write transaction at
        most per call; a database error answers False (the duty waits, never runs
        twice) and is logged."""
        with self._name_lock(name):
            now = self._clock()
            hold = self._held.get(name)
            if hold is not None and now - hold.confirmed_at < self.ttl_s / 3:
                return True
            if hold is None and now < self._busy_until.get(name, float("-inf")):
                return False
            return self._claim(name, now)

    def fence(self, name: str) -> int | None:
        """The fence number of this replica's hold of ``name`` (renewing it as
        :meth:`holds` does), None when it does not hold it. The number grows with
        every change of holder, so it orders the holds of one lease."""
        if not self.holds(name):
            return None
        with self._lock:
            hold = self._held.get(name)
        return hold.fence if hold is not None else None

    def held(self) -> set[str]:
        """The leases held as of their last confirmation (no database access)."""
        now = self._clock()
        with self._lock:
            return {n for n, h in self._held.items() if now - h.confirmed_at < self.ttl_s / 3}

    def release(self, name: str) -> None:
        """Hand lease ``name`` back now (when this replica holds it), so another
        replica may take it at once. The row stays (its fence keeps growing)."""
        self._release([name])

    def release_all(self) -> None:
        """Graceful shutdown: hand every lease this replica holds back at once (one
        write transaction). Best effort: on a database error the leases simply
        expire."""
        with self._lock:
            names = list(self._held)
        self._release(names)

    # -- internals -----------------------------------------------------------------
    def _name_lock(self, name: str) -> threading.Lock:
        with self._lock:
            found = self._name_locks.get(name)
            if found is None:
                found = self._name_locks[name] = threading.Lock()
            return found

    def _now_sql(self) -> ColumnElement[datetime]:
        """The time a lease's expiry is judged by: the database's on PostgreSQL (UTC,
        as the naive UTC the column stores), else ``ctx.clock``."""
        if self._postgres:
            return type_coerce(func.timezone("UTC", func.now()), UtcDateTime())
        return literal(self.ctx.clock.now(), UtcDateTime())

    def _expiry_sql(self) -> ColumnElement[datetime]:
        """A lease time from now (see :meth:`_now_sql`)."""
        ttl = timedelta(seconds=self.ttl_s)
        if self._postgres:
            now = func.timezone("UTC", func.now())
            return type_coerce(now + literal(ttl, Interval()), UtcDateTime())
        return literal(self.ctx.clock.now() + ttl, UtcDateTime())

    def _claim(self, name: str, started: float) -> bool:
        """Acquire or renew ``name`` in one write transaction; update the cache."""
        now = self._now_sql()
        expires = self._expiry_sql()
        insert = pg_insert if self._postgres else sqlite_insert
        base = insert(Lease).values(name=name, holder=self.holder, expires_at=expires, fence=1)
        stmt = base.on_conflict_do_update(
            index_elements=[Lease.name],
            set_={
                "holder": base.excluded.holder,
                "expires_at": base.excluded.expires_at,
                "fence": case(
                    (Lease.holder == base.excluded.holder, Lease.fence), else_=Lease.fence + 1
                ),
            },
            where=or_(Lease.holder == self.holder, Lease.expires_at < now),
        ).returning(Lease.fence)
        try:
            with self.ctx.transaction() as session:
                fence = session.scalar(stmt)
                left: timedelta | None = None
                if fence is None:
                    row = session.execute(
                        select(Lease.expires_at, self._now_sql()).where(Lease.name == name)
                    ).first()
                    if row is not None:
                        left = row[0] - row[1]
        except SQLAlchemyError:
            log.warning("lease %s: cannot reach the database; not holding it", name, exc_info=True)
            with self._lock:
                self._held.pop(name, None)
            return False
        with self._lock:
            if fence is not None:
                self._held[name] = _Hold(int(fence), started)
                self._busy_until.pop(name, None)
                return True
            if self._held.pop(name, None) is not None:
                log.warning("lease %s: lost to another replica", name)
            # Ask again when the other holder's lease would end, or after a third of
            # the lease time if sooner (a lease handed back is taken up that soon).
            wait = self.ttl_s / 3 if left is None else min(self.ttl_s / 3, left.total_seconds())
            self._busy_until[name] = started + max(0.0, wait)
            return False

    def _release(self, names: list[str]) -> None:
        # Under the names' locks (in one order: no deadlock with holds(), which takes
        # one at a time), so no renewal slips in between forgetting and expiring.
        with ExitStack() as stack:
            for name in sorted(set(names)):
                stack.enter_context(self._name_lock(name))
            with self._lock:
                mine = [n for n in names if self._held.pop(n, None) is not None]
            if not mine:
                return
            try:
                with self.ctx.transaction() as session:
                    session.execute(
                        update(Lease)
                        .where(Lease.name.in_(mine), Lease.holder == self.holder)
                        .values(expires_at=_RELEASED_AT)
                    )
            except SQLAlchemyError:
                log.warning("cannot release leases %s; they expire anyway", mine, exc_info=True)
