"""What the use cases need, passed explicitly rather than imported."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from sqlalchemy import Connection, Engine
from sqlalchemy.orm import Session, sessionmaker

from gpuyard.core.network.proxy import ProxyStatus
from gpuyard.core.ownership import Ownership
from gpuyard.services.catalog.references import ReferenceCache
from gpuyard.services.clock import Clock, SystemClock
from gpuyard.services.signals import Doorbell, WorkSignal
from gpuyard.settings import Settings
from gpuyard.store.db import WRITE_OPTIONS
from gpuyard.store.schema import Cluster


class StatusNotifier:
    """Wakes threads waiting for any cluster's recorded status to change."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._generation = 0
        self._listeners: set[Callable[[], None]] = set()

    def notify(self) -> None:
        with self._cond:
            self._generation += 1
            self._cond.notify_all()
            listeners = tuple(self._listeners)
        for listener in listeners:
            listener()

    def listen(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` (quick, never raising: an event loop's
        ``call_soon_threadsafe``) at every :meth:`notify` until :meth:`unlisten`."""
        with self._cond:
            self._listeners.add(listener)

    def unlisten(self, listener: Callable[[], None]) -> None:
        with self._cond:
            self._listeners.discard(listener)

    def generation(self) -> int:
        with self._cond:
            return self._generation

    def wait_change(self, since: int, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._generation == since:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            return self._generation


class ClusterReader(Protocol):
    """An accelerated read of one visible cluster row (its ledger totals included)."""

    def __call__(self, cluster_id: str, account_id: int) -> Cluster | None: ...


class IdleSince(dict[str, datetime]):
    """Since when each running cluster has been seen idle, with a ``version`` that
    every change moves: kept views compare it (api/fast/view_cache.py marks) instead of
    walking the whole map on each request."""

    version: int = 0

    def __setitem__(self, key: str, value: datetime) -> None:
        self.version += 1
        super().__setitem__(key, value)

    def __delitem__(self, key: str) -> None:
        self.version += 1
        super().__delitem__(key)

    def pop(self, key: str, default: datetime | None = None) -> datetime | None:  # type: ignore[override]
        if key in self:
            self.version += 1
        return super().pop(key, default)

    def setdefault(self, key: str, default: datetime) -> datetime:
        if key not in self:
            self.version += 1
        return super().setdefault(key, default)

    def clear(self) -> None:
        self.version += 1
        super().clear()


@dataclass
class Context:
    sessions: sessionmaker[Session]
    settings: Settings
    clock: Clock = field(default_factory=SystemClock)
    # Whose engine objects are ours (DESIGN.md rule 8). build_server sets the stored
    # installation's; the default (a fresh identity) suits tests of one store.
    ownership: Ownership = field(default_factory=Ownership.new)
    # Rung after a commit that gives the reconciler work (DESIGN.md rule 1; ``wake``);
    # the reconciler's lanes wait on it (services/signals.py).
    work: WorkSignal = field(default_factory=WorkSignal)
    notifier: StatusNotifier = field(default_factory=StatusNotifier)
    # Rung when a serverless job is queued or moves (services/serverless/): a worker's
    # job-take and a runsync wait on it instead of polling the store.
    jobs_notifier: StatusNotifier = field(default_factory=StatusNotifier)
    references: ReferenceCache = field(default_factory=ReferenceCache)
    # Since when each running cluster has been seen idle (auto-termination keeps it;
    # cluster views read it to show the next deadline). In memory: after a restart
    # the idle window starts again, which only ever delays a stop.
    idle_since: IdleSince = field(default_factory=lambda: IdleSince())
    # The same for running training clusters (by id): since when no Slurm job ran or
    # waited (reconciler/training/autoterm.py keeps it; training views read it).
    training_idle_since: dict[int, datetime] = field(default_factory=dict)
    # Optional accelerated read of one visible cluster row (store/sqlite_reader.py).
    cluster_reader: ClusterReader | None = None
    # Training clusters: hand an operation to the operator, re-sync a cluster's network
    # edge (host rules for its SSH port and reserved IPs) after a change. The server's
    # training operator answers both (services/signals.py).
    training_wake: Doorbell[int] = field(default_factory=Doorbell)
    training_edge: Doorbell[int] = field(default_factory=Doorbell)
    # The ``(port, transport)`` pairs of the port range something on host ``host_id``
    # holds now, apart from cluster ``cluster_id``'s own container
    # (Runtime.host_ports_in_use); build_server gives one that asks the host's runtime. Asked for a
    # port the user chose (services/capacity/placement.py assign_ports).
    ports_held: Callable[[int, str], frozenset[tuple[int, str]]] = lambda _host_id, _cluster_id: (
        frozenset()
    )
    # Whether this process's HTTP proxy serves (views show proxy URLs only then).
    proxy: ProxyStatus = field(default_factory=lambda: ProxyStatus(enabled=False))

    def wake(self) -> None:
        """After a commit that gives the reconciler work: it looks again now."""
        self.work.wake()

    @contextmanager
    def transaction(self) -> Iterator[Session]:
        """A write transaction: commits on success, rolls back on error. On SQLite it
        holds the write lock from its first statement (see store/db.py)."""
        with self.sessions() as session, session.begin():
            session.connection(execution_options=WRITE_OPTIONS)
            session.info["gpuyard.prices"] = self.settings.prices  # lifecycle.PRICES_KEY
            yield session

    @contextmanager
    def connect(self) -> Iterator[Connection]:
        """A plain connection for hot read paths: no ORM session to set up."""
        bind = self.sessions.kw["bind"]
        assert isinstance(bind, Engine)
        with bind.connect() as conn:
            yield conn

    @contextmanager
    def read(self) -> Iterator[Session]:
        with self.sessions() as session:
            yield session
