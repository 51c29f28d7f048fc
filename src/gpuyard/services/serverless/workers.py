"""The write funnels of serverless worker rows, and the finders the scaler reads them
by. A worker is one cluster of an endpoint (``clusters.serverless_endpoint_id``); its
row says what the scaler and the job routes may do with it.

Statuses: ``starting`` (its cluster is on its way up, it takes no job yet), ``ready``
(set by its first ping or take), ``recycle`` (its container must be replaced: set by
the queue's sweep), ``stopping`` (the scaler asked its cluster to stop or terminate),
``stopped`` (flashboot: its cluster is stopped and kept on its host with its volume
and image, for a fast start) and ``gone`` (its cluster is terminated or being
terminated; its key takes nothing).

Every function here runs inside the caller's transaction; a status change is a
guarded update (``WHERE status IN (...)``) so that a worker that took a job meanwhile
is never stopped under it.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from gpuyard.core.ids import worker_key_hash
from gpuyard.core.serverless.scaling import WorkerState
from gpuyard.store.schema import Cluster, ServerlessEndpoint, ServerlessWorker

STARTING = "starting"
READY = "ready"
RECYCLE = "recycle"
STOPPING = "stopping"
STOPPED = "stopped"
GONE = "gone"

# Workers that hold (or are on their way to hold) capacity and count for the scaler.
LIVE = (STARTING, READY, RECYCLE, STOPPING)
# Every status but gone: the workers whose clusters the scaler still watches.
WATCHED = (*LIVE, STOPPED)


@dataclass(frozen=True)
class WatchedWorker:
    """A worker the scaler watches and what its cluster is now (None: no row)."""

    worker_id: str
    status: str
    cluster_id: str | None
    endpoint_version: int
    jobs_in_progress: int
    last_busy_at: datetime | None
    created_at: datetime
    cluster_status: str | None
    # The container exited or vanished since it was started (a restart is scheduled, or
    # failures are counted): whatever it held is lost.
    container_died: bool

    def state(self) -> WorkerState:
        """As the scaler's decision sees it: a worker being replaced counts as stopping."""
        status = self.status if self.status in (STARTING, READY) else STOPPING
        return WorkerState(
            worker_id=self.worker_id,
            status=status,
            jobs_in_progress=self.jobs_in_progress,
            last_busy_at=self.last_busy_at or self.created_at,
        )


def register_worker(
    session: Session,
    endpoint: ServerlessEndpoint,
    *,
    worker_id: str,
    key: str,
    cluster_id: str,
    now: datetime,
) -> ServerlessWorker:
    """Record a new worker of ``endpoint`` running on cluster ``cluster_id`` (starting),
    with its key stored only as its hash and the endpoint's version it was started with.
    Runs inside the caller's transaction (the one that creates the cluster)."""
    worker = ServerlessWorker(
        id=worker_id,
        endpoint_id=endpoint.id,
        cluster_id=cluster_id,
        key_hash=worker_key_hash(key),
        status=STARTING,
        endpoint_version=endpoint.version,
        jobs_in_progress=0,
        created_at=now,
        updated_at=now,
    )
    session.add(worker)
    session.flush()
    return worker


def set_status(
    session: Session,
    worker_id: str,
    status: str,
    now: datetime,
    *,
    expected: Collection[str],
    idle_only: bool = False,
) -> bool:
    """Move the worker to ``status`` when it is in one of ``expected`` (and, with
    ``idle_only``, holds no job). Returns whether it moved. Runs inside the caller's
    transaction."""
    q = update(ServerlessWorker).where(
        ServerlessWorker.id == worker_id, ServerlessWorker.status.in_(list(expected))
    )
    if idle_only:
        q = q.where(ServerlessWorker.jobs_in_progress == 0)
    values: dict[str, object] = {"status": status, "updated_at": now}
    if status == STARTING:
        # A kept worker started again: idle time runs from its new start.
        values["last_busy_at"] = None
        values["last_ping_at"] = None
    if status in (STOPPED, GONE):
        values["jobs_in_progress"] = 0
    result = session.execute(q.values(**values).execution_options(synchronize_session=False))
    return bool(getattr(result, "rowcount", 0))


def mark_starting(session: Session, worker_id: str, now: datetime) -> bool:
    """A kept (stopped) worker's cluster is asked to start. Runs inside the caller's
    transaction."""
    return set_status(session, worker_id, STARTING, now, expected=(STOPPED,))


def mark_stopping(session: Session, worker_id: str, now: datetime) -> bool:
    """An idle ready worker is to be stopped (refused once it holds a job). Runs
    inside the caller's transaction."""
    return set_status(session, worker_id, STOPPING, now, expected=(READY,), idle_only=True)


def mark_stopped(session: Session, worker_id: str, now: datetime) -> bool:
    """Its cluster has stopped and is kept (flashboot). Runs inside the
    caller's transaction."""
    return set_status(session, worker_id, STOPPED, now, expected=(STOPPING, STARTING, READY))


def mark_gone(session: Session, worker_id: str, now: datetime) -> bool:
    """Its cluster is terminated (or being terminated): the worker is no more. Runs
    inside the caller's transaction."""
    return set_status(session, worker_id, GONE, now, expected=WATCHED)


def watched_workers(session: Session, endpoint_id: str) -> list[WatchedWorker]:
    """The endpoint's workers that are not gone, oldest first, each with its
    cluster's status. Runs inside the caller's session."""
    rows = session.execute(
        select(
            ServerlessWorker.id,
            ServerlessWorker.status,
            ServerlessWorker.cluster_id,
            ServerlessWorker.endpoint_version,
            ServerlessWorker.jobs_in_progress,
            ServerlessWorker.last_busy_at,
            ServerlessWorker.created_at,
            Cluster.status,
            Cluster.next_restart_at,
            Cluster.last_exit_code,
        )
        .outerjoin(Cluster, Cluster.id == ServerlessWorker.cluster_id)
        .where(
            ServerlessWorker.endpoint_id == endpoint_id,
            ServerlessWorker.status.in_(list(WATCHED)),
        )
        .order_by(ServerlessWorker.created_at, ServerlessWorker.id)
    )
    return [
        WatchedWorker(
            worker_id=r[0],
            status=r[1],
            cluster_id=r[2],
            endpoint_version=r[3],
            jobs_in_progress=r[4],
            last_busy_at=r[5],
            created_at=r[6],
            cluster_status=r[7],
            container_died=r[8] is not None or r[9] is not None,
        )
        for r in rows
    ]


def live_worker_states(session: Session, endpoint_id: str) -> list[WorkerState]:
    """The endpoint's live workers as the scaler's decision takes them. Runs inside the
    caller's session."""
    return [w.state() for w in watched_workers(session, endpoint_id) if w.status in LIVE]


def workers_started(session: Session, endpoint_id: str) -> int:
    """How many workers the endpoint ever had (new workers are numbered after them).
    Runs inside the caller's session."""
    count = session.scalar(
        select(func.count())
        .select_from(ServerlessWorker)
        .where(ServerlessWorker.endpoint_id == endpoint_id)
    )
    return int(count or 0)
