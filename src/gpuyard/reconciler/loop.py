"""The reconciler: a loop that, on every wake-up or interval, compares desired and
observed state from scratch and hands per-cluster work to the work queue.

At most one job runs per cluster at a time (in this process), so a start, a stop
and a collection of the same cluster never interleave; slow and urgent work run in
separate lanes of each engine (reconciler/lanes.py). A pass dispatches the clusters in
motion, due restarts, pending starts, volume moves and storage work, runs the duties
that are not per host (auto-termination, utilisation, budgets, serverless endpoints'
scalers) and, when due, queues
the engine checks (duties/engine_checks.py: heartbeats, observation, volume scans).

Its collaborators are built in one place, reconciler/wiring.py.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from sqlalchemy import select

from gpuyard.core.states import IN_MOTION, ClusterStatus
from gpuyard.reconciler.clusters.driver import ClusterDriver
from gpuyard.reconciler.clusters.snapshots import SnapshotWorker
from gpuyard.reconciler.duties.autoterminate import AutoTerminator
from gpuyard.reconciler.duties.budgets import BudgetWatch
from gpuyard.reconciler.duties.engine_checks import EngineChecks
from gpuyard.reconciler.duties.observation import Observation
from gpuyard.reconciler.duties.resting_gpus import RestingGpus
from gpuyard.reconciler.duties.utilization import UtilizationRecorder
from gpuyard.reconciler.duties.volume_scans import VolumeScans
from gpuyard.reconciler.duties.volume_usage import VolumeUsage
from gpuyard.reconciler.hosts import HostDirectory
from gpuyard.reconciler.lanes import SLOW, STORAGE, URGENT, Dispatcher
from gpuyard.reconciler.leases import (
    AUTOTERM_DUTY,
    BUDGET_DUTY,
    MAINTENANCE_DUTY,
    SERVERLESS_DUTY,
    Leases,
)
from gpuyard.reconciler.restarts import RestartSchedule
from gpuyard.reconciler.serverless.scaler import ServerlessScaler
from gpuyard.reconciler.workqueue import WorkQueue
from gpuyard.runtimes.fleet import Fleet
from gpuyard.services.clusters.moves import resting_moves
from gpuyard.services.clusters.pending_starts import due_pending_starts
from gpuyard.services.clusters.use_cases import start_pending
from gpuyard.services.context import Context
from gpuyard.services.volumes.snapshot_work import restore_holders, snapshots_to_take
from gpuyard.store.outage import is_database_unavailable
from gpuyard.store.schema import Cluster

log = logging.getLogger(__name__)


# Statuses whose work must never wait behind slow work.
_URGENT_STATUSES = {ClusterStatus.STOPPING.value, ClusterStatus.TERMINATING.value}
# On wakes, the duties (auto-termination, utilisation, budgets, serverless scaling)
# run at most this often; see Reconciler._run.
DUTY_GAP_S = 0.5
# The least the loop waits for its next pass after one failed (the database away).
FAILED_PASS_RETRY_S = 0.25


@dataclass(frozen=True)
class Duties:
    """What a pass runs besides the cluster steps, each in its own module."""

    autoterm: AutoTerminator
    utilization: UtilizationRecorder
    budget: BudgetWatch
    volume_usage: VolumeUsage
    volume_scans: VolumeScans
    resting_gpus: RestingGpus
    observation: Observation
    checks: EngineChecks
    serverless: ServerlessScaler


class Reconciler:
    """Drives every host of the fleet. With ``leases`` (several API replicas on one
    database) it works only on what this replica holds: the engines of the hosts it
    owns (``host:<id>``: their heartbeats, observation and the clusters on them),
    auto-termination and maintenance; without, everything.

    ``on_pass`` (metrics) is called after each loop pass with (lag_s, duration_s).
    Lag: from when the pass was due (the first wake() since the last pass, or the end
    of the sleep) to when it began."""

    def __init__(
        self,
        ctx: Context,
        fleet: Fleet,
        *,
        hosts: HostDirectory,
        dispatcher: Dispatcher,
        leases: Leases,
        driver: ClusterDriver,
        snapshots: SnapshotWorker,
        restarts: RestartSchedule,
        duties: Duties,
        on_pass: Callable[[float, float], None] | None = None,
    ) -> None:
        self.ctx = ctx
        self.fleet = fleet
        self.runtime = fleet.local
        self.hosts = hosts
        self.dispatcher = dispatcher
        self.queue: WorkQueue = dispatcher.queue
        self.leases = leases
        self.driver = driver
        self.snapshots = snapshots
        self.restarts = restarts
        self.duties = duties
        self.autoterm = duties.autoterm
        self.utilization = duties.utilization
        self.budget = duties.budget
        self.serverless = duties.serverless
        self.volume_usage = duties.volume_usage
        self.volume_scans = duties.volume_scans
        self.checks = duties.checks
        self.on_pass = on_pass
        self.heartbeat_every_s = ctx.settings.heartbeat_interval_s
        self._wakeup = dispatcher.wakeup
        self._thread: threading.Thread | None = None
        # Never: the first pass heartbeats. (Not 0.0: the monotonic clock counts from
        # boot, and on a machine up for less than the interval the first heartbeat
        # would wait for it.)
        self._last_heartbeat = -math.inf
        self._duties_at = -math.inf  # when the loop last ran the duties (monotonic)
        self._duties_owed = False
        self._pass_failed = False  # the last pass raised (see next_sleep_s)

    @property
    def host_id(self) -> int | None:
        """The host this server runs on (the first host if not set)."""
        return self.hosts.host_id

    @property
    def full_passes(self) -> int:
        """Full passes completed: a pass whose engine checks all observed their engine."""
        return self.checks.full_passes

    def lane_of(self, lane: str, host_id: int | None) -> str:
        """The queue lane ``lane`` of ``host_id``'s engine (made on first use), for work
        others run on this queue (the training operator)."""
        return self.dispatcher.lane_of(lane, host_id)

    # -- control -------------------------------------------------------------
    def start(self) -> None:
        if self.leases.holds(MAINTENANCE_DUTY):
            # Stale locks and partial data of a backup cut off by a crash are cleaned
            # before any storage work touches the repository (that work waits).
            self.snapshots.start_recovery()
        self.checks.started_at = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="reconciler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._wakeup.stop()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self.snapshots.wait_recovered(10)
        self.queue.close(wait=True)
        self.fleet.close()

    def wake(self) -> None:
        self._wakeup.wake()

    def _run(self) -> None:
        while not self.dispatcher.stopping:
            sleep_s = self.next_sleep_s()
            due_at = time.monotonic() + sleep_s
            woken_at = self._wakeup.wait(sleep_s)
            if self.dispatcher.stopping:
                break
            started = time.monotonic()
            # A wake (a create, a stop, each step of a start) runs the lifecycle work at
            # once; the duties, several milliseconds of reads each, at most every
            # DUTY_GAP_S on wakes: a start wakes the loop three or four times, and each
            # duty run took CPU from the start on a small host. A run skipped is owed
            # and made DUTY_GAP_S after the last (the sleep above ends for it), so a
            # policy or budget that changed waits at most that long.
            duties = woken_at is None or started - self._duties_at >= DUTY_GAP_S
            self._duties_owed = not duties
            if duties:
                self._duties_at = started
            self._pass_failed = True
            try:
                self.run_pass(duties=duties)
                self._pass_failed = False
            except Exception as exc:  # keep the loop alive; the next pass retries
                if is_database_unavailable(exc):
                    # A failover: every pass fails alike for seconds; one line each.
                    log.warning("reconcile pass waits for the database: %s", type(exc).__name__)
                else:
                    log.exception("reconcile pass failed")
            hook = self.on_pass
            if hook is not None:
                due = due_at if woken_at is None else min(due_at, woken_at)
                try:
                    hook(max(0.0, started - due), time.monotonic() - started)
                except Exception:  # metrics never stop the loop
                    log.exception("reconciler pass hook failed")

    def next_sleep_s(self) -> float:
        """How long the loop sleeps before its next pass (a wake ends it sooner): no
        longer than until the next auto-termination deadline, restart, budget
        crossing, webhook retry, heartbeat or owed duty run; after a pass that failed,
        at least FAILED_PASS_RETRY_S (its due work stays due while the database is
        away, and would have the loop retry at once, over and over)."""
        dues = [
            d
            for d in (
                self.autoterm.seconds_until_next(),
                self.restarts.seconds_until_next(),
                self.budget.seconds_until_next(),
                self.serverless.seconds_until_next(),
                self._heartbeat_in(),
                self._duties_owed_in(),
            )
            if d is not None
        ]
        sleep_s = min([self.ctx.settings.reconcile_interval_s, *dues])
        if self._pass_failed:
            sleep_s = max(sleep_s, FAILED_PASS_RETRY_S)
        return sleep_s

    # -- one pass ------------------------------------------------------------
    def run_pass(self, *, observe: bool | None = None, duties: bool = True) -> None:
        """Dispatch every cluster in motion and every restart that is due (on the
        engines this replica owns); run the duties held (auto-termination, utilisation,
        budgets, serverless scaling) unless ``duties`` is false; heartbeat and observe
        the engines when due."""
        with self.ctx.read() as session:
            moving = list(
                session.execute(
                    select(Cluster.id, Cluster.status, Cluster.host_id).where(
                        Cluster.status.in_([s.value for s in IN_MOTION])
                    )
                )
            )
        owned: dict[str, bool] = {}

        def mine(host_id: int | None) -> bool:
            if host_id in self.hosts.foreign:
                return False
            key = self.dispatcher.engine_key(host_id)
            if key not in owned:
                owned[key] = self.leases.holds(key)
            return owned[key]

        submit = self.dispatcher.submit_cluster
        for cluster_id, status, host_id in moving:
            if mine(host_id):
                lane = URGENT if status in _URGENT_STATUSES else SLOW
                submit(cluster_id, self.driver.drive, lane, host_id)
        for cid in self.restarts.take_due():
            submit(cid, self.driver.recover, SLOW, self._host_of(cid))
        # The rest of the pass's work in one read (a wake runs a pass; each read of its
        # own was a session and a transaction more on a start's path).
        with self.ctx.read() as session:
            pending = due_pending_starts(session)
            resting = resting_moves(session)
            snapshots = snapshots_to_take(session)
            restores = restore_holders(session)
        for cluster_id, host_id in pending:
            if mine(host_id):
                submit(cluster_id, partial(start_pending, self.ctx), URGENT, host_id)
        for cluster_id, to_host in resting:
            if mine(to_host):
                submit(cluster_id, self.driver.move_resting, SLOW, to_host)
        self._dispatch_storage(mine, snapshots, restores)
        if duties:
            self._run_duties()
        if observe is False:
            return
        if time.monotonic() - self._last_heartbeat >= self.heartbeat_every_s or observe:
            self._last_heartbeat = time.monotonic()
            self.checks.queue_all(force_observe=bool(observe))

    def _duties_owed_in(self) -> float | None:
        """Seconds until a duty run skipped on a wake is due (None: none owed)."""
        if not self._duties_owed:
            return None
        return max(0.0, self._duties_at + DUTY_GAP_S - time.monotonic())

    def _run_duties(self) -> None:
        """The duties this replica holds, each kept from stopping the others."""
        if self.leases.holds(AUTOTERM_DUTY):
            try:
                # Idle windows sampled under another holder's fence start again.
                self.autoterm.run(fence=self.leases.fence(AUTOTERM_DUTY))
            except Exception:  # never let a policy problem stop the lifecycle work
                log.exception("auto-termination pass failed")
            try:
                self.utilization.run()
            except Exception:  # the charts' history never stops the lifecycle work
                log.exception("utilisation sample failed")
        if self.leases.holds(BUDGET_DUTY):
            try:
                self.budget.run()
            except Exception:  # a budget problem never stops the lifecycle work
                log.exception("budget watch pass failed")
        if self.leases.holds(SERVERLESS_DUTY):
            try:
                self.serverless.run()
            except Exception:  # an endpoint's scaling never stops the lifecycle work
                log.exception("serverless scaler pass failed")

    def _heartbeat_in(self) -> float:
        """Seconds until the next heartbeat is due: the loop wakes for it on time, so
        heartbeats keep their interval (the unreachable bound counts on it)."""
        return max(0.0, self._last_heartbeat + self.heartbeat_every_s - time.monotonic())

    def _dispatch_storage(
        self,
        mine: Callable[[int | None], bool],
        snapshots: list[tuple[str, int]],
        restores: list[tuple[str, int]],
    ) -> None:
        """Snapshots being taken and network volume restores (as read by the pass),
        each on its host's storage lane (a job per snapshot or volume at a time)."""
        submit = self.dispatcher.submit_cluster
        for snapshot_id, host_id in snapshots:
            if mine(host_id):
                submit(
                    snapshot_id,
                    self.snapshots.take,
                    STORAGE,
                    host_id,
                    job_key=("snapshot", snapshot_id),
                )
        for volume_id, host_id in restores:
            if mine(host_id):
                submit(
                    volume_id,
                    self.snapshots.restore_network_volume,
                    STORAGE,
                    host_id,
                    job_key=("restore", volume_id),
                )

    def _host_of(self, cluster_id: str) -> int | None:
        with self.ctx.read() as session:
            return session.scalar(select(Cluster.host_id).where(Cluster.id == cluster_id))

    # -- in this thread (tests and tools) ---------------------------------------------
    def heartbeat_now(self) -> None:
        """Heartbeat (and observe) every engine this replica owns, in this thread
        (tests and tools; the loop queues these on each engine's lane)."""
        for key, host_ids in self.checks.owned():
            self.checks.check(key, host_ids, True)

    def observe(self) -> None:
        """Observe every engine this replica owns now, in this thread (tests)."""
        if self.leases.holds(MAINTENANCE_DUTY):
            self.duties.resting_gpus.free()
        for key, host_ids in self.checks.owned():
            self.observe_engine(key, host_ids)

    def observe_engine(self, key: str, host_ids: tuple[int, ...]) -> bool:
        """Observe one engine (duties/observation.py), in this thread."""
        return self.duties.observation.observe_engine(key, host_ids)

    def scan_volumes(self) -> None:
        """Quarantine unknown volumes of ours; delete those past their retention (every
        engine this replica owns, in this thread)."""
        for _key, host_ids in self.checks.owned():
            self.volume_scans.scan_engine(self.hosts.runtime_of(host_ids), host_ids)

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
                        .where(
                            Cluster.status.in_([s.value for s in IN_MOTION])
                            | Cluster.pending_start.is_not(None)
                        )
                        .limit(1)
                    )
                if moving is None and self.idle():
                    return True
            time.sleep(0.02)
        return False
