"""The scaler's steps on one endpoint's workers: bring worker rows in line with their
clusters (``settle``), start workers (a kept one first with flashboot, else a new
cluster through the clusters' create use case), stop idle ones, and drain a deleted
endpoint. Each step owns its transactions and calls the cluster use cases as the
endpoint's account; none calls a runtime.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session

from gpuyard.core.errors import GpuyardError, InsufficientCapacity
from gpuyard.core.ids import new_worker_id, new_worker_key
from gpuyard.core.states import ClusterStatus
from gpuyard.reconciler.serverless.ports import QueuePort
from gpuyard.services.clusters.actions import endpoint_stop, endpoint_terminate
from gpuyard.services.clusters.cluster_rows import owner_principal
from gpuyard.services.clusters.requests import CreateCluster, StartCluster
from gpuyard.services.clusters.use_cases import create_cluster, start_cluster
from gpuyard.services.context import Context
from gpuyard.services.serverless import workers as rows
from gpuyard.services.serverless.workers import WatchedWorker
from gpuyard.services.tenancy.auth import Principal, Scope
from gpuyard.store.schema import Cluster, ServerlessEndpoint

log = logging.getLogger(__name__)

# A worker name's room for the endpoint's name (a cluster name is at most 200).
_NAME_ROOM = 180
# The worker's key, sealed in its cluster's env like any secret.
_KEY_VAR = "RUNPOD_AI_API_KEY"

_GONE_CLUSTER = (ClusterStatus.TERMINATING.value, ClusterStatus.TERMINATED.value)
_RESTING = (ClusterStatus.STOPPING.value, ClusterStatus.STOPPED.value)
_UP = (ClusterStatus.PENDING.value, ClusterStatus.STARTING.value, ClusterStatus.RUNNING.value)


@dataclass
class Outcome:
    """What one pass did to an endpoint's workers (worker ids)."""

    started: list[str] = field(default_factory=list)
    resumed: list[str] = field(default_factory=list)
    stopped: list[str] = field(default_factory=list)
    gone: list[str] = field(default_factory=list)


def endpoint_principal(endpoint: ServerlessEndpoint) -> Principal:
    """Acting for the endpoint's account, in its project (the scaler's own moves)."""
    return Principal(
        key_id=0,
        user_id=0,
        account_id=endpoint.account_id,
        scope=Scope.WRITE,
        default_project_id=endpoint.project_id,
    )


def _keeps(endpoint: ServerlessEndpoint, w: WatchedWorker) -> bool:
    """Whether a worker leaving service is kept stopped rather than terminated."""
    return (
        endpoint.flashboot
        and endpoint.status == "active"
        and w.endpoint_version == endpoint.version
    )


class WorkerSteps:
    def __init__(self, ctx: Context, queue: QueuePort, base_url: str, max_retries: int) -> None:
        self.ctx = ctx
        self.queue = queue
        self.base_url = base_url
        self.max_retries = max_retries

    # -- worker rows and their clusters -------------------------------------------
    def settle(self, endpoint: ServerlessEndpoint, w: WatchedWorker, out: Outcome) -> None:
        """Bring one worker's row in line with its cluster: a dead container or a
        cluster stopped under it gives its jobs back; a worker to recycle is replaced;
        a stop the scaler asked for ends in ``stopped`` (kept) or ``gone``."""
        status, cluster = w.status, w.cluster_status
        if cluster is None or cluster in _GONE_CLUSTER:
            self._gone(endpoint, w, "its cluster is gone", out, terminate=False)
        elif status in (rows.STARTING, rows.READY):
            if w.container_died or cluster == ClusterStatus.ERROR.value:
                self._gone(endpoint, w, "its container exited", out)
            elif cluster in _RESTING:
                # Stopped under it (a spent budget, a suspension, a drain).
                self._give_back(w, "its cluster was stopped")
                if _keeps(endpoint, w):
                    self._mark(w, rows.STOPPING if cluster != "stopped" else rows.STOPPED)
                else:
                    self._gone(endpoint, w, "its cluster was stopped", out)
        elif status == rows.RECYCLE:
            self._gone(endpoint, w, "it is replaced", out)
        elif status == rows.STOPPING:
            if w.container_died or cluster == ClusterStatus.ERROR.value:
                self._gone(endpoint, w, "its container exited", out)
            elif cluster == ClusterStatus.STOPPED.value:
                if _keeps(endpoint, w):
                    self._mark(w, rows.STOPPED)
                    out.stopped.append(w.worker_id)
                else:
                    self._gone(endpoint, w, "stopped", out)
            elif cluster in _UP:
                # The stop was marked but not asked for (a crash in between): ask again.
                self._leave(endpoint, w, out)
        elif status == rows.STOPPED:
            if cluster == ClusterStatus.ERROR.value or not _keeps(endpoint, w):
                # Failed, or kept for a version of the endpoint that changed since.
                self._gone(endpoint, w, "no longer kept", out)
            elif cluster in _UP:
                # Started, its row not yet told (a crash in between).
                self._mark(w, rows.STARTING)

    def _give_back(self, w: WatchedWorker, why: str) -> None:
        now = self.ctx.clock.now()
        with self.ctx.transaction() as session:
            self.queue.give_back_jobs(
                session, w.worker_id, f"worker {w.worker_id} was lost: {why}", now,
                max_retries=self.max_retries,
            )  # fmt: skip

    def _mark(self, w: WatchedWorker, status: str) -> None:
        now = self.ctx.clock.now()
        with self.ctx.transaction() as session:
            rows.set_status(session, w.worker_id, status, now, expected=rows.WATCHED)

    def _gone(
        self,
        endpoint: ServerlessEndpoint,
        w: WatchedWorker,
        why: str,
        out: Outcome,
        *,
        terminate: bool = True,
    ) -> None:
        """Give its jobs back, terminate its cluster, and the worker is gone."""
        now = self.ctx.clock.now()
        with self.ctx.transaction() as session:
            self.queue.give_back_jobs(
                session, w.worker_id, f"worker {w.worker_id} was lost: {why}", now,
                max_retries=self.max_retries,
            )  # fmt: skip
            rows.mark_gone(session, w.worker_id, now)
        if terminate and w.cluster_id is not None:
            endpoint_terminate(
                self.ctx, w.cluster_id, endpoint.id, f"serverless worker {w.worker_id}: {why}"
            )
        out.gone.append(w.worker_id)

    # -- stopping --------------------------------------------------------------
    def stop_idle(self, endpoint: ServerlessEndpoint, w: WatchedWorker, out: Outcome) -> None:
        """Stop an idle worker (refused when it took a job meanwhile)."""
        now = self.ctx.clock.now()
        with self.ctx.transaction() as session:
            moved = rows.mark_stopping(session, w.worker_id, now)
        if moved:
            self._leave(endpoint, w, out)

    def _leave(self, endpoint: ServerlessEndpoint, w: WatchedWorker, out: Outcome) -> None:
        """Ask a stopping worker's cluster to stop (kept) or terminate (gone)."""
        if w.cluster_id is None:
            return
        if _keeps(endpoint, w):
            endpoint_stop(
                self.ctx, w.cluster_id, endpoint.id, f"serverless worker {w.worker_id}: idle"
            )
            return
        self._gone(endpoint, w, "idle", out)

    def drain(
        self, endpoint: ServerlessEndpoint, watched: list[WatchedWorker], out: Outcome
    ) -> None:
        """A deleted endpoint whose jobs are all done: every worker terminated, kept
        ones too."""
        for w in watched:
            self._gone(endpoint, w, "its endpoint is deleted", out)

    # -- starting --------------------------------------------------------------
    def start(
        self, endpoint: ServerlessEndpoint, count: int, kept: list[WatchedWorker], out: Outcome
    ) -> str | None:
        """Start ``count`` workers, kept ones first. Returns why not all could be (a
        quota, a budget, no capacity), or None."""
        for _ in range(count):
            while kept:
                w = kept.pop(0)
                if self._resume(endpoint, w):
                    out.resumed.append(w.worker_id)
                    break
            else:
                worker_id, refusal = self._create(endpoint)
                if refusal is not None:
                    return refusal
                out.started.append(worker_id)
        return None

    def _resume(self, endpoint: ServerlessEndpoint, w: WatchedWorker) -> bool:
        """Start a kept worker's stopped cluster where it is (its host, volume and image
        are there; its container is made again). False when its host cannot take it."""
        if w.cluster_id is None:
            return False
        with self.ctx.read() as session:
            principal = owner_principal(session, w.cluster_id)
        if principal is None:
            return False
        try:
            start_cluster(
                self.ctx,
                principal,
                w.cluster_id,
                StartCluster(allow_move=False),
                acting_for=endpoint.id,
            )
        except GpuyardError as exc:
            log.info("kept worker %s cannot start: %s", w.worker_id, exc.message)
            return False
        with self.ctx.transaction() as session:
            rows.mark_starting(session, w.worker_id, self.ctx.clock.now())
        return True

    def _create(self, endpoint: ServerlessEndpoint) -> tuple[str, str | None]:
        """A new worker: a cluster of the endpoint's settings with RunPod's worker
        environment, on the first GPU type and location that has room. Returns its id
        and None, or the refusal's message."""
        worker_id, key = new_worker_id(), new_worker_key()
        env: dict[str, Any] = dict(
            self.queue.worker_environment(self.base_url, endpoint.id, worker_id, key)
        )
        env[_KEY_VAR] = {"value": env.get(_KEY_VAR, key), "secret": True}
        with self.ctx.read() as session:
            number = rows.workers_started(session, endpoint.id) + 1
        now = self.ctx.clock.now()

        def record(session: Session, cluster: Cluster) -> None:
            rows.register_worker(
                session, endpoint, worker_id=worker_id, key=key, cluster_id=cluster.id, now=now
            )

        gpu_types: list[str | None] = list(endpoint.gpu_type_ids) or [None]
        locations: list[str | None] = list(endpoint.locations) or [None]
        refusal: str | None = None
        for location in locations:
            for gpu_type in gpu_types:
                body = CreateCluster.model_validate(
                    {
                        "name": f"{endpoint.name[:_NAME_ROOM]}-worker-{number}",
                        "project_id": endpoint.project_id,
                        "docker_image": endpoint.image,
                        "gpu_type": gpu_type,
                        "gpu_count": endpoint.gpu_count if gpu_type is not None else 0,
                        "cpu_cores": endpoint.cpu_cores,
                        "memory_gb": endpoint.memory_gb,
                        "container_disk_gb": endpoint.container_disk_gb,
                        "volume_gb": endpoint.volume_gb,
                        "volume_mount_path": endpoint.volume_mount_path,
                        "network_volume_id": endpoint.network_volume_id,
                        "env": env,
                    }
                )
                try:
                    create_cluster(
                        self.ctx,
                        endpoint_principal(endpoint),
                        body,
                        location=location,
                        serverless_endpoint_id=endpoint.id,
                        sealed_env=dict(endpoint.env or {}),
                        record_with=record,
                    )
                except InsufficientCapacity as exc:
                    refusal = exc.message
                    continue
                except GpuyardError as exc:
                    return worker_id, exc.message
                return worker_id, None
        return worker_id, refusal or "no host can take a worker now"
