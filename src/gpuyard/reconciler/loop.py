"""The reconciler: a loop that, on every wake-up or interval, compares desired and
observed state from scratch and hands per-cluster work to the work queue.

At most one job runs per cluster at a time (in this process), so a start, a stop
and a collection of the same cluster never interleave; slow work (starts, which pull
images and wait for readiness; restarts) and urgent work (stops, terminates,
collection) run in separate lanes (reconciler/workqueue.py). A periodic pass also
observes the engine, looking only at this installation's objects:

- a running cluster whose container died is brought back (ClusterDriver.recover);
- a container of ours that no cluster should have is removed once it has been seen
  so for the grace period (``GPUYARD_ORPHAN_CONTAINER_GRACE_S``);
- a volume of ours the database does not know is quarantined, never deleted on sight
  (reconciler/orphans.py);
- GPU rows held by resting clusters are freed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta

from sqlalchemy import delete, select

from gpuyard.core.errors import GpuyardError
from gpuyard.core.states import HOLDS_COMPUTE, IN_MOTION, MAY_HAVE_CONTAINER, ClusterStatus
from gpuyard.reconciler.autoterminate import AutoTerminator
from gpuyard.reconciler.driver import ClusterDriver
from gpuyard.reconciler.orphans import VolumeCollector
from gpuyard.reconciler.workqueue import WorkQueue
from gpuyard.runtimes.base import ContainerState, Runtime
from gpuyard.services.context import Context
from gpuyard.services.idempotency import purge_expired
from gpuyard.store.schema import Cluster, GpuAllocation, Host

log = logging.getLogger(__name__)

URGENT = "urgent"
SLOW = "slow"
# Statuses whose work must never wait behind slow work.
_URGENT_STATUSES = {ClusterStatus.STOPPING.value, ClusterStatus.TERMINATING.value}


class Reconciler:
    def __init__(
        self,
        ctx: Context,
        runtime: Runtime,
        *,
        observe_every_s: float = 5.0,
        volume_scan_every_s: float = 30.0,
        host_id: int | None = None,
    ) -> None:
        self.ctx = ctx
        self.runtime = runtime
        runtime.bind(ctx.ownership)
        self.driver = ClusterDriver(ctx, runtime)
        self.driver.on_restart_due = self._restart_due_at
        self.autoterm = AutoTerminator(ctx, runtime)
        self.observe_every_s = observe_every_s
        self.volume_scan_every_s = volume_scan_every_s
        self._host_id = host_id
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        workers = max(2, ctx.settings.reconcile_workers)
        self.queue = WorkQueue({URGENT: workers, SLOW: workers}, on_done=self.wake)
        self._thread: threading.Thread | None = None
        self._last_observe = 0.0
        self._last_volume_scan = 0.0
        # Containers of ours that no cluster should have: when each was first seen so.
        self._unknown_since: dict[str, datetime] = {}
        # Clusters whose next restart attempt is due at the given time.
        self._restarts_due: dict[str, datetime] = {}
        # Metrics hook (observability/metrics.py): called after each loop pass with
        # (lag_s, duration_s). Lag: from when the pass was due (the first wake() since
        # the last pass, or the end of the sleep) to when it began.
        self.on_pass: Callable[[float, float], None] | None = None
        self._woken_at: float | None = None

    @property
    def host_id(self) -> int | None:
        """The host whose engine this reconciler drives (the first host if not set)."""
        if self._host_id is None:
            with self.ctx.read() as session:
                self._host_id = session.scalar(select(Host.id).order_by(Host.id).limit(1))
        return self._host_id

    # -- control -------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="reconciler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.queue.close(wait=True)

    def wake(self) -> None:
        if self._woken_at is None:
            self._woken_at = time.monotonic()
        self._wake.set()

    def _run(self) -> None:
        while not self._stopping.is_set():
            # Sleep no longer than until the next auto-termination deadline or restart.
            timeout = self.ctx.settings.reconcile_interval_s
            dues = [
                d for d in (self.autoterm.seconds_until_next(), self._restart_in()) if d is not None
            ]
            sleep_s = min([timeout, *dues])
            due_at = time.monotonic() + sleep_s
            self._wake.wait(sleep_s)
            self._wake.clear()
            woken_at, self._woken_at = self._woken_at, None
            if self._stopping.is_set():
                break
            started = time.monotonic()
            try:
                self.run_pass()
            except Exception:  # keep the loop alive; the next pass retries from scratch
                log.exception("reconcile pass failed")
            hook = self.on_pass
            if hook is not None:
                due = due_at if woken_at is None else min(due_at, woken_at)
                try:
                    hook(max(0.0, started - due), time.monotonic() - started)
                except Exception:  # metrics never stop the loop
                    log.exception("reconciler pass hook failed")

    # -- one pass ------------------------------------------------------------
    def run_pass(self, *, observe: bool | None = None) -> None:
        """Dispatch every cluster in motion and every restart that is due; observe
        the engine when due."""
        with self.ctx.read() as session:
            moving = list(
                session.execute(
                    select(Cluster.id, Cluster.status).where(
                        Cluster.status.in_([s.value for s in IN_MOTION])
                    )
                )
            )
        for cluster_id, status in moving:
            lane = URGENT if status in _URGENT_STATUSES else SLOW
            self._submit(cluster_id, self.driver.drive, lane)
        now = self.ctx.clock.now()
        with self._lock:
            due = [cid for cid, at in self._restarts_due.items() if at <= now]
            for cid in due:
                del self._restarts_due[cid]
        for cid in due:
            self._submit(cid, self.driver.recover, SLOW)
        try:
            self.autoterm.run()
        except Exception:  # never let a policy problem stop the lifecycle work
            log.exception("auto-termination pass failed")
        due_observe = time.monotonic() - self._last_observe >= self.observe_every_s
        if observe or (observe is None and due_observe):
            self._last_observe = time.monotonic()
            self.observe()

    def _restart_due_at(self, cluster_id: str, at: datetime) -> None:
        with self._lock:
            self._restarts_due[cluster_id] = at
        self.wake()

    def _restart_in(self) -> float | None:
        with self._lock:
            if not self._restarts_due:
                return None
            first = min(self._restarts_due.values())
        return max(0.0, (first - self.ctx.clock.now()).total_seconds())

    def observe(self) -> None:
        """Compare this installation's containers (and, less often, volumes) with the
        store; see the module docstring."""
        try:
            containers = self.runtime.list_managed()
        except GpuyardError as exc:
            # An engine that does not answer (e.g. restarting) is not evidence that
            # anything died: nothing is recovered or collected until it answers.
            log.warning("cannot list containers: %s", exc.message)
            return
        listed_at = self.ctx.clock.now()
        by_cluster = {c.cluster_id: c for c in containers}
        with self.ctx.transaction() as session:
            rows = list(
                session.execute(
                    select(Cluster.id, Cluster.status, Cluster.updated_at).where(
                        Cluster.status.in_([s.value for s in MAY_HAVE_CONTAINER])
                    )
                )
            )
            # GPU rows of clusters that no longer hold compute (a crash between the
            # status change and the release, or a manual DB edit) are freed here.
            resting = select(Cluster.id).where(
                Cluster.status.not_in([s.value for s in HOLDS_COMPUTE])
            )
            session.execute(delete(GpuAllocation).where(GpuAllocation.cluster_id.in_(resting)))
        live = {cid: (ClusterStatus(status), updated) for cid, status, updated in rows}
        for cid, (status, updated) in live.items():
            seen = by_cluster.get(cid)
            dead = seen is None or seen.state != ContainerState.RUNNING
            if status == ClusterStatus.RUNNING and updated < listed_at and dead:
                self._submit(cid, self.driver.recover, SLOW)
        self._collect_containers(set(by_cluster) - set(live), listed_at)
        self._sync_host_limits()
        if time.monotonic() - self._last_volume_scan >= self.volume_scan_every_s:
            self._last_volume_scan = time.monotonic()
            self.scan_volumes()
            purge_expired(self.ctx)  # idempotency keys past their 24 h
            # Our network isolation rules, repaired if a firewall reload dropped them.
            try:
                self.runtime.guard_networks()
            except GpuyardError as exc:
                log.warning("cannot re-apply network isolation: %s", exc.message)

    def _collect_containers(self, unexpected: set[str], now: datetime) -> None:
        """Containers of ours that no cluster should have are removed only once they
        have been seen so for the grace period (a create racing the listing, or a
        store briefly behind, never loses a container)."""
        grace = timedelta(seconds=self.ctx.settings.orphan_container_grace_s)
        for cid in list(self._unknown_since):
            if cid not in unexpected:
                del self._unknown_since[cid]
        for cid in unexpected:
            first = self._unknown_since.setdefault(cid, now)
            if now - first >= grace:
                self._submit(cid, self.driver.collect_container, URGENT)

    def _sync_host_limits(self) -> None:
        """Show on the host whether its engine enforces CPU/memory limits (the runtime
        learns it from the engine's refusal), so creates can refuse with a clear error."""
        host_id = self.host_id
        if host_id is None:
            return
        problem = self.runtime.capabilities().limits_problem
        wanted = (problem is None, problem)
        with self.ctx.read() as session:
            shown = session.execute(
                select(Host.enforces_limits, Host.limits_note).where(Host.id == host_id)
            ).one_or_none()
        if shown is None or tuple(shown) == wanted:
            return  # the usual case: no write transaction every observe pass
        with self.ctx.transaction() as session:
            host = session.get(Host, host_id)
            if host is not None:
                host.enforces_limits, host.limits_note = wanted

    def scan_volumes(self) -> None:
        """Quarantine unknown volumes of ours; delete those past their retention."""
        host_id = self.host_id
        if host_id is not None:
            VolumeCollector(self.ctx, self.runtime, host_id).scan()

    # -- dispatch ------------------------------------------------------------
    def _submit(self, cluster_id: str, job: Callable[[str], None], lane: str) -> None:
        if self._stopping.is_set():
            return
        self.queue.submit(cluster_id, lane, lambda: self._run_job(cluster_id, job))

    @staticmethod
    def _run_job(cluster_id: str, job: Callable[[str], None]) -> None:
        try:
            job(cluster_id)
        except GpuyardError as exc:
            # Engine trouble: the queue retries this cluster after a back-off.
            log.warning("reconcile job for cluster %s failed: %s", cluster_id, exc.message)
            raise

    def idle(self) -> bool:
        return not self.queue.busy()

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """For tests and shutdown: wait until no job runs and nothing is in motion."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.run_pass(observe=False)
            if self.idle():
                with self.ctx.read() as session:
                    moving = session.scalar(
                        select(Cluster.id)
                        .where(Cluster.status.in_([s.value for s in IN_MOTION]))
                        .limit(1)
                    )
                if moving is None and self.idle():
                    return True
            time.sleep(0.02)
        return False
