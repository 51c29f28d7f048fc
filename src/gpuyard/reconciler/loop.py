"""The reconciler: a loop that, on every wake-up or interval, compares desired and
observed state from scratch and hands per-cluster work to a thread pool.

At most one job runs per cluster at a time (in this process), so a start, a stop
and an orphan removal of the same cluster never interleave. A periodic pass also
observes the engine: running clusters whose container died fail, containers no
cluster should have are removed, and GPU rows held by resting clusters are freed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from sqlalchemy import delete, select

from gpuyard.core.errors import GpuyardError
from gpuyard.core.states import HOLDS_COMPUTE, IN_MOTION, MAY_HAVE_CONTAINER, ClusterStatus
from gpuyard.reconciler.autoterminate import AutoTerminator
from gpuyard.reconciler.driver import ClusterDriver
from gpuyard.runtimes.base import ContainerState, Runtime
from gpuyard.services.context import Context
from gpuyard.store.schema import Cluster, GpuAllocation

log = logging.getLogger(__name__)


class Reconciler:
    def __init__(self, ctx: Context, runtime: Runtime, *, observe_every_s: float = 5.0) -> None:
        self.ctx = ctx
        self.runtime = runtime
        self.driver = ClusterDriver(ctx, runtime)
        self.autoterm = AutoTerminator(ctx, runtime)
        self.observe_every_s = observe_every_s
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._in_flight: set[str] = set()
        self._pool = ThreadPoolExecutor(
            max_workers=ctx.settings.reconcile_workers, thread_name_prefix="reconcile"
        )
        self._thread: threading.Thread | None = None
        self._last_observe = 0.0
        # Metrics hook (observability/metrics.py): called after each loop pass with
        # (lag_s, duration_s). Lag: from when the pass was due (the first wake() since
        # the last pass, or the end of the sleep) to when it began.
        self.on_pass: Callable[[float, float], None] | None = None
        self._woken_at: float | None = None

    # -- control -------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="reconciler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._pool.shutdown(wait=True, cancel_futures=True)

    def wake(self) -> None:
        if self._woken_at is None:
            self._woken_at = time.monotonic()
        self._wake.set()

    def _run(self) -> None:
        while not self._stopping.is_set():
            # Sleep no longer than until the next auto-termination deadline.
            timeout = self.ctx.settings.reconcile_interval_s
            due_in = self.autoterm.seconds_until_next()
            sleep_s = timeout if due_in is None else min(timeout, due_in)
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
        """Dispatch every cluster in motion; observe the engine when due."""
        with self.ctx.read() as session:
            moving = list(
                session.scalars(
                    select(Cluster.id).where(Cluster.status.in_([s.value for s in IN_MOTION]))
                )
            )
        for cluster_id in moving:
            self._submit(cluster_id, self.driver.drive)
        try:
            self.autoterm.run()
        except Exception:  # never let a policy problem stop the lifecycle work
            log.exception("auto-termination pass failed")
        due = time.monotonic() - self._last_observe >= self.observe_every_s
        if observe or (observe is None and due):
            self._last_observe = time.monotonic()
            self.observe()

    def observe(self) -> None:
        try:
            containers = self.runtime.list_managed()
        except GpuyardError as exc:
            log.warning("cannot list containers: %s", exc.message)
            return
        listed_at = self.ctx.clock.now()
        by_cluster = {c.cluster_id: c for c in containers}
        with self.ctx.transaction() as session:
            rows = list(session.execute(select(Cluster.id, Cluster.status, Cluster.updated_at)))
            # GPU rows of clusters that no longer hold compute (a crash between the
            # status change and the release, or a manual DB edit) are freed here.
            resting = select(Cluster.id).where(
                Cluster.status.not_in([s.value for s in HOLDS_COMPUTE])
            )
            session.execute(delete(GpuAllocation).where(GpuAllocation.cluster_id.in_(resting)))
        known = {cid: (ClusterStatus(status), updated) for cid, status, updated in rows}
        for cid, (status, updated) in known.items():
            seen = by_cluster.get(cid)
            dead = seen is None or seen.state != ContainerState.RUNNING
            if status == ClusterStatus.RUNNING and updated < listed_at and dead:
                self._submit(cid, self.driver.check_running)
        for cid in by_cluster:
            status_updated = known.get(cid)
            if status_updated is None or status_updated[0] not in MAY_HAVE_CONTAINER:
                self._submit(cid, self.driver.collect_orphan)

    # -- dispatch ------------------------------------------------------------
    def _submit(self, cluster_id: str, job: Callable[[str], None]) -> None:
        with self._lock:
            if cluster_id in self._in_flight or self._stopping.is_set():
                return
            self._in_flight.add(cluster_id)
        try:
            self._pool.submit(self._run_job, cluster_id, job)
        except RuntimeError:  # pool shut down
            with self._lock:
                self._in_flight.discard(cluster_id)

    def _run_job(self, cluster_id: str, job: Callable[[str], None]) -> None:
        try:
            job(cluster_id)
        except Exception:
            log.exception("reconcile job for cluster %s failed", cluster_id)
        finally:
            with self._lock:
                self._in_flight.discard(cluster_id)
            # The cluster may have been changed while we worked (stop during start).
            self.wake()

    def idle(self) -> bool:
        with self._lock:
            return not self._in_flight

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
