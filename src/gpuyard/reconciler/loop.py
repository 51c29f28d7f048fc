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
  (reconciler/duties/orphans.py);
- GPU rows held by resting clusters are freed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from functools import partial
from typing import Any, Protocol

from sqlalchemy import Select, delete, func, select, true

from gpuyard.core.errors import GpuyardError
from gpuyard.core.fleet import HostStatus
from gpuyard.core.states import HOLDS_COMPUTE, IN_MOTION, MAY_HAVE_CONTAINER, ClusterStatus
from gpuyard.reconciler.duties.autoterminate import AutoTerminator
from gpuyard.reconciler.duties.budgets import BudgetWatch
from gpuyard.reconciler.clusters.driver import ClusterDriver
from gpuyard.reconciler.duties.orphans import VolumeCollector
from gpuyard.reconciler.clusters.snapshots import SnapshotWorker, repositories_for
from gpuyard.reconciler.duties.utilization import UtilizationRecorder
from gpuyard.reconciler.duties.volume_usage import VolumeUsage
from gpuyard.reconciler.workqueue import WorkQueue
from gpuyard.runtimes.base import ContainerState, Runtime
from gpuyard.runtimes.fleet import SHARED_ENGINE, Fleet, HostEngine
from gpuyard.services.clusters import start_drained, start_pending
from gpuyard.services.context import Context
from gpuyard.services.host_health import record_heartbeat
from gpuyard.services.idempotency import purge_expired
from gpuyard.services.moves import COPYING, DRAIN_STOP
from gpuyard.services.pending_starts import due_pending_starts
from gpuyard.services.replica import replica_id
from gpuyard.services.snapshot_work import restore_holders, snapshots_to_take
from gpuyard.services.training_drain import retry_training_drains
from gpuyard.services.webhooks import deliver as deliver_webhook
from gpuyard.store.outage import is_database_unavailable
from gpuyard.store.schema import Cluster, GpuAllocation, Host, VolumeMove

log = logging.getLogger(__name__)


class Leases(Protocol):
    """Which duties this replica owns now (services/leases.py LeaseKeeper)."""

    def holds(self, name: str) -> bool: ...

    def fence(self, name: str) -> int | None: ...


class _AllMine:
    """A lone server owns every duty."""

    def holds(self, name: str) -> bool:
        return True

    def fence(self, name: str) -> int | None:
        return None


# Duties that are not per host, each owned by one replica at a time.
AUTOTERM_DUTY = "autoterm"
MAINTENANCE_DUTY = "maintenance"
TRAINING_DUTY = "training"
# Budget alerts, stops at a spent budget, and webhook deliveries.
BUDGET_DUTY = "budget"

URGENT = "urgent"
SLOW = "slow"
# Heartbeats: a lane of their own per engine, so a host's long engine operations (an
# observation waiting out its timeout on a hung engine) never delay its next heartbeat.
HEARTBEAT = "heartbeat"
# Snapshots and network volume restores: long reads and writes of whole volumes, on
# lanes of their own so they never hold up a start or a stop.
STORAGE = "storage"
STORAGE_WORKERS = 4
# Webhook deliveries: outbound POSTs that may take their timeout, off the other lanes.
WEBHOOKS = "webhooks"
WEBHOOK_WORKERS = 4
# Statuses whose work must never wait behind slow work.
_URGENT_STATUSES = {ClusterStatus.STOPPING.value, ClusterStatus.TERMINATING.value}
# Clusters that hold GPU rows but no longer hold compute: read from gpu_allocations (as
# many rows as GPUs in use) and the cluster's primary key, never from the clusters
# table's history.
_RESTING_HOLDERS = (
    select(GpuAllocation.cluster_id)
    .join(Cluster, Cluster.id == GpuAllocation.cluster_id)
    .where(Cluster.status.not_in([s.value for s in HOLDS_COMPUTE]))
    .distinct()
)

# Clusters that may have a container (on the hosts of an engine, when it has hosts):
# id and status, the observe pass's comparison with the engine's listing.
_MAY_HAVE = select(Cluster.id, Cluster.status).where(
    Cluster.status.in_([s.value for s in MAY_HAVE_CONTAINER])
)


def _fingerprint(scope: Select[str, str]) -> Select[int, Any, Any, Any, Any]:
    """An aggregate of the rows ``scope`` selects that changes when one of them comes,
    goes or is written through the status funnel or a guarded update (each bumps the
    version and sets updated_at), computed in the database: no row reaches Python."""
    return select(
        func.count(),
        func.sum(Cluster.version),
        func.max(Cluster.updated_at),
        func.min(Cluster.id),
        func.max(Cluster.id),
    ).where(scope.whereclause if scope.whereclause is not None else true())


class _FullPass:
    """Counts down the engine checks one pass queued: complete (``done`` called once)
    when the last has finished and every one of them observed its engine. A check
    replaced by a later pass's never reports, so that pass is simply not full."""

    def __init__(self, engines: int, done: Callable[[], None]) -> None:
        self._left = engines
        self._all_observed = engines > 0
        self._done = done
        self._lock = threading.Lock()

    def engine_done(self, observed: bool) -> None:
        with self._lock:
            self._left -= 1
            self._all_observed = self._all_observed and observed
            finished = self._left == 0 and self._all_observed
        if finished:
            self._done()


class Reconciler:
    """Drives every host of the fleet (``runtime`` is a Fleet, or one runtime serving
    every host). With ``leases`` (several API replicas on one database) it works only
    on what this replica holds: the engines of the hosts it owns (``host:<id>``: their
    heartbeats, observation and the clusters on them), auto-termination and
    maintenance; without, everything."""

    def __init__(
        self,
        ctx: Context,
        runtime: Runtime | Fleet,
        *,
        observe_every_s: float = 5.0,
        volume_scan_every_s: float = 30.0,
        host_id: int | None = None,
        leases: Leases | None = None,
    ) -> None:
        self.ctx = ctx
        self.fleet = runtime if isinstance(runtime, Fleet) else Fleet(runtime)
        self.fleet.set_hosts(self.host_engine)
        self.fleet.bind(ctx.ownership)
        self.runtime = self.fleet.local
        self.leases: Leases = leases or _AllMine()
        self.driver = ClusterDriver(ctx, self.fleet.for_host)
        self.driver.on_restart_due = self._restart_due_at
        self.autoterm = AutoTerminator(ctx, self.fleet.for_host)
        self.utilization = UtilizationRecorder(ctx, self.fleet.for_host, self.autoterm.gpu_uuids)
        self.budget = BudgetWatch(ctx, dispatch=self._send_webhook)
        # Measured volume usage and network volume removals, per engine.
        self.volume_usage = VolumeUsage(ctx)
        self.observe_every_s = observe_every_s
        self.heartbeat_every_s = ctx.settings.heartbeat_interval_s
        self.volume_scan_every_s = volume_scan_every_s
        self._host_id = host_id
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        # One volume scan at a time: a scan that listed the engine before a volume
        # appeared must not record its view after a later scan quarantined it.
        self._volume_scan_lock = threading.Lock()
        self._workers = max(2, ctx.settings.reconcile_workers)
        self.queue = WorkQueue(
            {
                URGENT: self._workers,
                SLOW: self._workers,
                HEARTBEAT: self._workers,
                STORAGE: STORAGE_WORKERS,
                WEBHOOKS: WEBHOOK_WORKERS,
            },
            on_done=self.wake,
        )
        self.snapshots = SnapshotWorker(
            ctx, self.fleet.for_host, repositories_for(ctx.settings), replica_id()
        )
        self.driver.storage = self.snapshots
        self._thread: threading.Thread | None = None
        self._last_heartbeat = 0.0
        self._last_observe: dict[str, float] = {}
        self._last_volume_scan: dict[str, float] = {}
        self._last_resting_sweep = float("-inf")
        # Hosts as last read from the store (engine URL, status), refreshed every pass
        # that looks at engines.
        self._hosts: dict[int, HostEngine] = {}
        self._foreign: set[int] = set()
        # Hosts whose inventory this process has read (on_host_answered), and those a
        # heartbeat found answering for the first time or again, to be described on
        # the engine's observation lane (the heartbeat's lane does no long work).
        self._described: set[int] = set()
        self._to_describe: set[int] = set()
        # Per engine: its last listing (cluster id -> state) and the fingerprint of the
        # clusters it was compared with, kept while that comparison found nothing to do.
        self._last_compare: dict[str, tuple[dict[str, ContainerState], tuple[Any, ...]]] = {}
        # Containers of ours that no cluster should have: when each was first seen so.
        self._unknown_since: dict[tuple[str, str], datetime] = {}
        # Clusters whose next restart attempt is due at the given time.
        self._restarts_due: dict[str, datetime] = {}
        # Metrics hook (observability/metrics.py): called after each loop pass with
        # (lag_s, duration_s). Lag: from when the pass was due (the first wake() since
        # the last pass, or the end of the sleep) to when it began.
        self.on_pass: Callable[[float, float], None] | None = None
        self._woken_at: float | None = None
        # Told (outside any transaction) when a host first answers or comes back, e.g.
        # to discover its inventory.
        self.on_host_answered: Callable[[HostEngine, Runtime], None] | None = None
        # Full passes completed: a pass whose engine checks all observed their engine
        # (metrics; the first one after a start is logged with its delay).
        self.full_passes = 0
        self.on_full_pass: Callable[[], None] | None = None
        self._started_at: float | None = None

    @property
    def host_id(self) -> int | None:
        """The host this server runs on (the first host if not set)."""
        if self._host_id is None:
            with self.ctx.read() as session:
                self._host_id = session.scalar(
                    select(Host.id).order_by(Host.is_local.desc(), Host.id).limit(1)
                )
        return self._host_id

    # -- hosts -----------------------------------------------------------------
    def refresh_hosts(self) -> dict[int, HostEngine]:
        """Re-read every host's engine address from the store."""
        own = self.host_id
        with self.ctx.read() as session:
            rows = list(
                session.execute(
                    select(Host.id, Host.name, Host.engine_url, Host.engine_tls_dir, Host.is_local)
                )
            )
        # Another replica's own machine is driven by that replica (its engine URL is a
        # socket on that machine), never from here.
        self._foreign = {r.id for r in rows if r.is_local and r.id != own}
        hosts = {
            r.id: HostEngine(r.id, r.name, r.engine_url, r.engine_tls_dir, r.id == own)
            for r in rows
            if r.id not in self._foreign
        }
        gone = set(self._hosts) - set(hosts)
        self._hosts = hosts
        for host_id in gone:
            self.fleet.forget(host_id)
        return hosts

    def host_engine(self, host_id: int) -> HostEngine | None:
        """How to reach ``host_id`` (the fleet's lookup)."""
        found = self._hosts.get(host_id)
        if found is None:
            found = self.refresh_hosts().get(host_id)
        return found

    def _engine_key(self, host_id: int | None) -> str:
        return SHARED_ENGINE if host_id is None else self.fleet.key_of(host_id)

    def lane_of(self, lane: str, host_id: int | None) -> str:
        """The queue lane ``lane`` of ``host_id``'s engine (made on first use), for work
        others run on this queue (the training operator)."""
        return self._lane(lane, self._engine_key(host_id))

    def _lane(self, lane: str, key: str) -> str:
        """Each engine has its own lanes, so a slow or dead host holds up only its own
        work."""
        if key == SHARED_ENGINE:
            return lane
        name = f"{lane}:{key}"
        self.queue.ensure_lane(name, self._workers)
        return name

    # -- control -------------------------------------------------------------
    def start(self) -> None:
        if self.leases.holds(MAINTENANCE_DUTY):
            # Stale locks and partial data of a backup cut off by a crash are cleaned
            # before any storage work touches the repository (that work waits).
            self.snapshots.start_recovery()
        self._started_at = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="reconciler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.queue.close(wait=True)
        self.fleet.close()

    def wake(self) -> None:
        if self._woken_at is None:
            self._woken_at = time.monotonic()
        self._wake.set()

    def _run(self) -> None:
        while not self._stopping.is_set():
            # Sleep no longer than until the next auto-termination deadline, restart,
            # budget crossing or webhook retry.
            timeout = self.ctx.settings.reconcile_interval_s
            dues = [
                d
                for d in (
                    self.autoterm.seconds_until_next(),
                    self._restart_in(),
                    self.budget.seconds_until_next(),
                    self._heartbeat_in(),
                )
                if d is not None
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

    # -- one pass ------------------------------------------------------------
    def run_pass(self, *, observe: bool | None = None) -> None:
        """Dispatch every cluster in motion and every restart that is due (on the
        engines this replica owns); heartbeat and observe the engines when due."""
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
            if host_id in self._foreign:
                return False
            key = self._engine_key(host_id)
            if key not in owned:
                owned[key] = self.leases.holds(key)
            return owned[key]

        for cluster_id, status, host_id in moving:
            if mine(host_id):
                lane = URGENT if status in _URGENT_STATUSES else SLOW
                self._submit(cluster_id, self.driver.drive, lane, host_id)
        now = self.ctx.clock.now()
        with self._lock:
            due = [cid for cid, at in self._restarts_due.items() if at <= now]
            for cid in due:
                del self._restarts_due[cid]
        for cid in due:
            self._submit(cid, self.driver.recover, SLOW, self._host_of(cid))
        with self.ctx.read() as session:
            pending = due_pending_starts(session)
        for cluster_id, host_id in pending:
            if mine(host_id):
                self._submit(cluster_id, partial(start_pending, self.ctx), URGENT, host_id)
        self._dispatch_moves(mine)
        self._dispatch_storage(mine)
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
        if observe is False:
            return
        if time.monotonic() - self._last_heartbeat >= self.heartbeat_every_s or observe:
            self._last_heartbeat = time.monotonic()
            self._check_engines(force_observe=bool(observe))

    def _heartbeat_in(self) -> float:
        """Seconds until the next heartbeat is due: the loop wakes for it on time, so
        heartbeats keep their interval (the unreachable bound counts on it)."""
        return max(0.0, self._last_heartbeat + self.heartbeat_every_s - time.monotonic())

    def _dispatch_moves(self, mine: Callable[[int | None], bool]) -> None:
        """Volume moves of resting clusters (a drain) run on their new host's lanes."""
        with self.ctx.read() as session:
            resting = list(
                session.execute(
                    select(VolumeMove.cluster_id, VolumeMove.to_host_id)
                    .join(Cluster, Cluster.id == VolumeMove.cluster_id)
                    .where(
                        VolumeMove.status == COPYING,
                        Cluster.status.in_(
                            [ClusterStatus.STOPPED.value, ClusterStatus.ERROR.value]
                        ),
                    )
                )
            )
        for cluster_id, to_host in resting:
            if mine(to_host):
                self._submit(cluster_id, self.driver.move_resting, SLOW, to_host)

    def _dispatch_storage(self, mine: Callable[[int | None], bool]) -> None:
        """Snapshots being taken and network volume restores, each on its host's
        storage lane (a job per snapshot or volume at a time)."""
        for snapshot_id, host_id in snapshots_to_take(self.ctx):
            if mine(host_id):
                self._submit(
                    snapshot_id,
                    self.snapshots.take,
                    STORAGE,
                    host_id,
                    job_key=("snapshot", snapshot_id),
                )
        for volume_id, host_id in restore_holders(self.ctx):
            if mine(host_id):
                self._submit(
                    volume_id,
                    self.snapshots.restore_network_volume,
                    STORAGE,
                    host_id,
                    job_key=("restore", volume_id),
                )

    def _restart_drained(self, host_ids: tuple[int, ...]) -> None:
        """Clusters a drain of these hosts stopped are started on other hosts (level
        based: a cluster that cannot move yet is tried again on the next scan)."""
        with self.ctx.read() as session:
            q = (
                select(Cluster.id)
                .join(Host, Host.id == Cluster.host_id)
                .where(
                    Host.status == HostStatus.DRAINING.value,
                    Cluster.status == ClusterStatus.STOPPED.value,
                    Cluster.status_reason.startswith(f"stopped ({DRAIN_STOP}"),
                )
            )
            if host_ids:
                q = q.where(Cluster.host_id.in_(host_ids))
            drained = list(session.scalars(q))
        for cluster_id in drained:
            problem = start_drained(self.ctx, cluster_id)
            if problem is not None:
                log.warning("drained cluster %s cannot move yet: %s", cluster_id, problem)

    def _host_of(self, cluster_id: str) -> int | None:
        with self.ctx.read() as session:
            return session.scalar(select(Cluster.host_id).where(Cluster.id == cluster_id))

    def _send_webhook(self, delivery_id: int) -> None:
        """One attempt of a due webhook delivery, on the webhook lane."""

        def job() -> None:
            deliver_webhook(self.ctx, delivery_id)

        if not self._stopping.is_set():
            self.queue.submit(("webhook", delivery_id), WEBHOOKS, job)

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

    # -- engines: heartbeat, observe -----------------------------------------------
    def _engines(self) -> list[tuple[str, tuple[int, ...]]]:
        """The engines of every host (one shared engine without a factory)."""
        hosts = self.refresh_hosts()
        engines = self.fleet.engines(hosts.values())
        return engines or [(SHARED_ENGINE, ())]

    def _check_engines(self, *, force_observe: bool = False) -> None:
        """Queue one heartbeat (and observation, when due) per engine this replica
        owns, each on its engine's own lane. The pass is full once every one of them
        has observed its engine (``_FullPass``)."""
        sweep_due = time.monotonic() - self._last_resting_sweep >= self.volume_scan_every_s
        if sweep_due and self.leases.holds(MAINTENANCE_DUTY):
            # A safety net (a crash between a status change and the release): as often
            # as the volume scan, not at every heartbeat.
            self._last_resting_sweep = time.monotonic()
            self._free_resting_gpus()
        owned = [(key, ids) for key, ids in self._engines() if self.leases.holds(key)]
        tracker = _FullPass(len(owned), self._full_pass_done)
        for key, host_ids in owned:
            self.queue.submit(
                ("heartbeat", key),
                self._lane(HEARTBEAT, key),
                partial(self._heartbeat_tracked, tracker, key, host_ids, force_observe),
            )

    def _heartbeat_tracked(
        self, tracker: _FullPass, key: str, host_ids: tuple[int, ...], force_observe: bool
    ) -> None:
        """Heartbeat one engine; if it answered, hand its observation to the engine's
        urgent lane (the pass is told there)."""
        handed_on = False
        try:
            runtime = self._heartbeat(key, host_ids)
            if runtime is not None:
                handed_on = self.queue.submit(
                    ("engine", key),
                    self._lane(URGENT, key),
                    partial(self._observe_tracked, tracker, key, host_ids, runtime, force_observe),
                )
        finally:
            if not handed_on:
                tracker.engine_done(False)

    def _observe_tracked(
        self,
        tracker: _FullPass,
        key: str,
        host_ids: tuple[int, ...],
        runtime: Runtime,
        force_observe: bool,
    ) -> None:
        observed = False
        try:
            observed = self._after_answer(key, host_ids, runtime, force_observe)
        finally:
            tracker.engine_done(observed)

    def _full_pass_done(self) -> None:
        self.full_passes += 1
        if self.full_passes == 1 and self._started_at is not None:
            log.info(
                "first full reconcile pass completed %.3f s after the reconciler started",
                time.monotonic() - self._started_at,
            )
        hook = self.on_full_pass
        if hook is not None:
            try:
                hook()
            except Exception:  # metrics never stop the loop
                log.exception("reconciler full-pass hook failed")

    def _check_engine(self, key: str, host_ids: tuple[int, ...], force_observe: bool) -> bool:
        """Heartbeat one engine and observe it when due, in this thread; whether it
        was observed."""
        runtime = self._heartbeat(key, host_ids)
        if runtime is None:
            return False
        return self._after_answer(key, host_ids, runtime, force_observe)

    def _heartbeat(self, key: str, host_ids: tuple[int, ...]) -> Runtime | None:
        """Ping one engine with the heartbeat's own short timeout and record what it
        said for its hosts: the runtime when it answered, None when it did not."""
        runtime = self._engine_runtime(host_ids)
        problem = runtime.heartbeat(self.ctx.settings.heartbeat_timeout_s)
        if host_ids:
            changed = record_heartbeat(
                self.ctx, host_ids, problem, misses_allowed=self.ctx.settings.heartbeat_misses
            )
            if problem is None:
                # Described when it first answers here, and again when it comes back.
                with self._lock:
                    fresh = [h for h in host_ids if h not in self._described]
                    self._described.update(host_ids)
                    self._to_describe.update(changed, fresh)
        if problem is not None:
            # An engine that does not answer is not evidence that anything died:
            # nothing on it is recovered or collected until it answers.
            log.warning("engine %s does not answer: %s", key, problem)
            return None
        return runtime

    def _after_answer(
        self, key: str, host_ids: tuple[int, ...], runtime: Runtime, force_observe: bool
    ) -> bool:
        """What follows an answered heartbeat, on the engine's urgent lane: describe
        hosts that answer for the first time or again, and observe the engine when due
        (whether it was observed)."""
        self._describe(host_ids, runtime)
        last = self._last_observe.get(key, 0.0)
        if force_observe or time.monotonic() - last >= self.observe_every_s:
            self._last_observe[key] = time.monotonic()
            observed = self.observe_engine(key, host_ids)
            # Moves away from these hosts: drained clusters go, old copies are deleted.
            self._restart_drained(host_ids)
            try:
                retry_training_drains(self.ctx, host_ids)
            except Exception:  # the next scan tries again; the engine's work goes on
                log.exception("moving training nodes off draining hosts failed")
            self.driver.delete_old_copies(list(host_ids) or None)
            return observed
        return False

    def _describe(self, host_ids: tuple[int, ...], runtime: Runtime) -> None:
        hook = self.on_host_answered
        with self._lock:
            due = sorted(self._to_describe.intersection(host_ids))
            self._to_describe.difference_update(due)
        if hook is None:
            return
        for host_id in due:
            host = self._hosts.get(host_id)
            if host is not None:
                try:
                    hook(host, runtime)
                except Exception:  # inventory is retried on the next change
                    log.exception("host %s: after-answer hook failed", host_id)

    def heartbeat_now(self) -> None:
        """Heartbeat (and observe) every engine this replica owns, in this thread
        (tests and tools; the loop queues these on each engine's lane)."""
        for key, host_ids in self._engines():
            if self.leases.holds(key):
                self._check_engine(key, host_ids, True)

    def _engine_runtime(self, host_ids: Iterable[int]) -> Runtime:
        first = next(iter(host_ids), None)
        return self.fleet.for_host(first)

    def observe(self) -> None:
        """Observe every engine this replica owns now, in this thread (tests)."""
        if self.leases.holds(MAINTENANCE_DUTY):
            self._free_resting_gpus()
        for key, host_ids in self._engines():
            if self.leases.holds(key):
                self.observe_engine(key, host_ids)

    def observe_engine(self, key: str, host_ids: tuple[int, ...]) -> bool:
        """Compare one engine's containers of this installation (and, less often, its
        volumes) with the store; see the module docstring. False when the engine
        could not list its containers (nothing was compared)."""
        runtime = self._engine_runtime(host_ids)
        try:
            containers = runtime.list_managed()
        except GpuyardError as exc:
            # An engine that does not answer (e.g. restarting) is not evidence that
            # anything died: nothing is recovered or collected until it answers.
            log.warning("cannot list containers on %s: %s", key, exc.message)
            return False
        listed_at = self.ctx.clock.now()
        states = {c.cluster_id: c.state for c in containers}
        shared = key == SHARED_ENGINE
        scope = _MAY_HAVE.where(Cluster.host_id.in_(host_ids)) if not shared else _MAY_HAVE
        with self.ctx.connect() as conn:
            fingerprint = tuple(conn.execute(_fingerprint(scope)).one())
            last = self._last_compare.get(key)
            if last is not None and last == (states, fingerprint):
                # The engine lists what it listed last time and no cluster that may have
                # a container changed since: last time's comparison found nothing to
                # recover or collect, and would find the same now.
                live: dict[str, str] | None = None
            else:
                live = {cid: status for cid, status in conn.execute(scope)}
        if live is not None:
            recovering = self._recover_dead(live, states, listed_at, host_ids)
            unexpected = states.keys() - live.keys()
            self._collect_containers(key, host_ids, unexpected, listed_at)
            if recovering or unexpected:
                self._last_compare.pop(key, None)
            else:
                self._last_compare[key] = (states, fingerprint)
        self._sync_host_limits(runtime, host_ids)
        if self.volume_usage.due(key):
            # A disk-usage report may walk every volume: off the heartbeat's lane.
            job = partial(self.volume_usage.run, runtime, host_ids)
            self.queue.submit(("volume-usage", key), self._lane(SLOW, key), job)
        last_scan = self._last_volume_scan.get(key, 0.0)
        if time.monotonic() - last_scan >= self.volume_scan_every_s:
            self._last_volume_scan[key] = time.monotonic()
            self._scan_engine_volumes(runtime, host_ids)
            if self.leases.holds(MAINTENANCE_DUTY):
                purge_expired(self.ctx)  # idempotency keys past their 24 h
                # Data of deleted and failed snapshots leaves the repository.
                self.queue.submit(
                    ("storage", "forget"),
                    STORAGE,
                    self.snapshots.forget_unwanted,
                )
            # Our network isolation rules, repaired if a firewall reload dropped them.
            try:
                runtime.guard_networks()
            except GpuyardError as exc:
                log.warning("cannot re-apply network isolation on %s: %s", key, exc.message)
        return True

    def _recover_dead(
        self,
        live: dict[str, str],
        states: dict[str, ContainerState],
        listed_at: datetime,
        host_ids: tuple[int, ...],
    ) -> bool:
        """Recover each running cluster (of ``live``: id -> status) whose container the
        listing (``states``) shows dead or missing, unless the cluster was written
        since the listing (a start racing it). Whether any was found dead."""
        running = ClusterStatus.RUNNING.value
        alive = ContainerState.RUNNING
        dead = [
            cid for cid, status in live.items() if status == running and states.get(cid) != alive
        ]
        if not dead:
            return False
        with self.ctx.read() as session:
            for start in range(0, len(dead), 500):
                for cid in session.scalars(
                    select(Cluster.id).where(
                        Cluster.id.in_(dead[start : start + 500]),
                        Cluster.status == running,
                        Cluster.updated_at < listed_at,
                    )
                ):
                    self._submit(cid, self.driver.recover, SLOW, host_ids[0] if host_ids else None)
        return True

    def _free_resting_gpus(self) -> None:
        """GPU rows of clusters that no longer hold compute (a crash between the status
        change and the release, or a manual DB edit) are freed.

        Driven from the allocations (a row per GPU in use, however long the history)
        joined to their clusters by primary key, and read first: the usual pass finds
        nothing and takes no write lock. Holders that are not clusters (training nodes'
        owner ids) match no cluster row and are left alone."""
        with self.ctx.read() as session:
            stale = list(session.scalars(_RESTING_HOLDERS))
        if not stale:
            return
        with self.ctx.transaction() as session:
            # Checked again under the write lock: a start may have claimed them since.
            session.execute(
                delete(GpuAllocation).where(GpuAllocation.cluster_id.in_(_RESTING_HOLDERS))
            )

    def _collect_containers(
        self, key: str, host_ids: tuple[int, ...], unexpected: set[str], now: datetime
    ) -> None:
        """Containers of ours that no cluster should have (on this engine) are removed
        only once they have been seen so for the grace period (a create racing the
        listing, or a store briefly behind, never loses a container)."""
        grace = timedelta(seconds=self.ctx.settings.orphan_container_grace_s)
        for seen in [s for s in self._unknown_since if s[0] == key]:
            if seen[1] not in unexpected:
                del self._unknown_since[seen]
        host = host_ids[0] if host_ids and key != SHARED_ENGINE else None
        for cid in unexpected:
            first = self._unknown_since.setdefault((key, cid), now)
            if now - first >= grace:
                self._submit(
                    cid,
                    partial(self._collect_one, on_host=host),
                    URGENT,
                    host,
                    job_key=("collect", key, cid),
                )

    def _collect_one(self, cluster_id: str, *, on_host: int | None) -> None:
        self.driver.collect_container(cluster_id, on_host=on_host)

    def _sync_host_limits(self, runtime: Runtime, host_ids: tuple[int, ...]) -> None:
        """Show on the hosts whether their engine enforces CPU/memory limits and disk
        sizes (the runtime learns it from the engine's refusal or the host's probe), so
        creates can refuse with a clear error."""
        ids = host_ids or ((self.host_id,) if self.host_id is not None else ())
        if not ids:
            return
        caps = runtime.capabilities()
        problem, disk = caps.limits_problem, caps.disk_problem
        wanted = (problem is None, problem, disk is None, disk)
        with self.ctx.read() as session:
            shown = list(
                session.execute(
                    select(
                        Host.id,
                        Host.enforces_limits,
                        Host.limits_note,
                        Host.enforces_disk,
                        Host.disk_note,
                    ).where(Host.id.in_(ids))
                )
            )
        stale = [
            r.id
            for r in shown
            if (r.enforces_limits, r.limits_note, r.enforces_disk, r.disk_note) != wanted
        ]
        if not stale:
            return  # the usual case: no write transaction every observe pass
        with self.ctx.transaction() as session:
            for host_id in stale:
                host = session.get(Host, host_id)
                if host is not None:
                    host.enforces_limits, host.limits_note = wanted[0], wanted[1]
                    host.enforces_disk, host.disk_note = wanted[2], wanted[3]

    def _scan_engine_volumes(self, runtime: Runtime, host_ids: tuple[int, ...]) -> None:
        # One engine shared by several host rows keeps its quarantine under the local
        # host, as before there were fleets.
        host_id = host_ids[0] if len(host_ids) == 1 else self.host_id
        if host_id is not None:
            with self._volume_scan_lock:
                VolumeCollector(self.ctx, runtime, host_id).scan()

    def scan_volumes(self) -> None:
        """Quarantine unknown volumes of ours; delete those past their retention (every
        engine this replica owns, in this thread)."""
        for key, host_ids in self._engines():
            if self.leases.holds(key):
                self._scan_engine_volumes(self._engine_runtime(host_ids), host_ids)

    # -- dispatch ------------------------------------------------------------
    def _submit(
        self,
        cluster_id: str,
        job: Callable[[str], None],
        lane: str,
        host_id: int | None,
        *,
        job_key: object = None,
    ) -> None:
        if self._stopping.is_set():
            return
        lane_name = self._lane(lane, self._engine_key(host_id))
        self.queue.submit(
            job_key if job_key is not None else cluster_id,
            lane_name,
            lambda: self._run_job(cluster_id, job),
        )

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
