"""Enforcement of auto-termination policies.

Each pass computes every running cluster's earliest deadline (core/autoterm.py) and
fires the ones due: the cluster moves to ``stopping`` (or ``terminating``) through
the status funnel with the rule and figures as the reason. The reconciler sleeps no
longer than until the next deadline, so a rule fires within a fraction of a second
of its time — also for deadlines that passed while the server was down (the first
pass after start fires them). Idleness is sampled from the engine's stats and GPU
utilisation every ``idle_sample_interval_s``; a cluster is idle when its CPU and
every one of its GPUs are under their thresholds.

Training clusters' policies are enforced by the same watcher: ``training`` (when the
server runs training clusters, reconciler/training/autoterm.py) runs in each pass,
after the clusters, and its deadlines count for the next wake-up; its firings go to
``on_fire`` with the cluster's holder id (``tc-<id>``).

One cluster never stops the watch of the others: a stored policy that does not
validate is not enforced and is reported once (a log line and an ``auto_terminate``
event on that cluster), and any error while reading, sampling or firing one cluster
is caught, logged once and recorded on that cluster alone.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import cast

from sqlalchemy import Connection, Select, func, select

from gpuyard.core.autoterm import (
    Deadline,
    Rule,
    deadlines,
    idle_deadline,
    read_policy,
    run_started_at,
)
from gpuyard.core.errors import Conflict, GpuyardError
from gpuyard.core.models import AutoTerminatePolicy, GpuTypeInfo
from gpuyard.core.states import ClusterStatus
from gpuyard.core.training import clusters as training_domain
from gpuyard.reconciler.training.autoterm import TrainingAutoTerminator
from gpuyard.runtimes.base import Runtime
from gpuyard.services.clusters.lifecycle import record_event, transition_cluster
from gpuyard.services.clusters.views import cluster_rate
from gpuyard.services.context import Context
from gpuyard.store.schema import Cluster, Event, HostGpu

log = logging.getLogger(__name__)

_RUNNING = Cluster.status == ClusterStatus.RUNNING.value
_RUNNING_VERSIONS: Select[str, int] = select(Cluster.id, Cluster.version).where(_RUNNING)
# What changes when a running cluster comes, goes or changes: every write through the
# status funnel or a guarded update bumps the version and sets updated_at to its time,
# and a cluster that enters ``running`` is the newest written. Aggregated in the
# database over the status index: no row reaches Python.
_RUNNING_FINGERPRINT = select(
    func.count(),
    func.sum(Cluster.version),
    func.max(Cluster.updated_at),
    func.min(Cluster.id),
    func.max(Cluster.id),
).where(_RUNNING)
# Read the versions in full at least this often even when the aggregate is unchanged:
# a write outside the funnel (a manual edit) is seen within this time.
FULL_READ_EVERY_S = 30.0

# GPU utilisation (percent, one per GPU) of the GPUs with these UUIDs; None when it
# cannot be measured (declared GPUs: nothing runs on them, so they count as idle).
GpuUtilization = Callable[[tuple[str, ...]], list[float] | None]


def nvml_utilization(uuids: tuple[str, ...]) -> list[float] | None:
    """Utilisation of real GPUs through nvidia-ml-py; None without a driver."""
    if not uuids:
        return None
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no driver or library: nothing to measure
        return None
    try:
        return [
            float(pynvml.nvmlDeviceGetUtilizationRates(pynvml.nvmlDeviceGetHandleByUUID(u)).gpu)
            for u in uuids
        ]
    except Exception:
        return None
    finally:
        pynvml.nvmlShutdown()


@dataclass
class _Watched:
    """A running cluster with a policy, and its deadlines that do not depend on
    idleness (fixed for the run: the run's rate does not change while it runs)."""

    cluster: Cluster
    policy: AutoTerminatePolicy
    rate: float
    fixed: Deadline | None = None

    def __post_init__(self) -> None:
        plan = deadlines(
            self.policy,
            run_started_at=run_start(self.cluster),
            hourly_rate=self.rate,
            idle_since=None,
        )
        self.fixed = plan[0] if plan else None

    def first(self, idle_since: datetime | None) -> Deadline | None:
        idle = idle_deadline(self.policy, idle_since)
        if idle is None:
            return self.fixed
        return idle if self.fixed is None or idle.at < self.fixed.at else self.fixed


def run_start(c: Cluster) -> datetime:
    return run_started_at(c.start_initiated_at, c.started_at, c.created_at)


@dataclass(frozen=True)
class Fired:
    cluster_id: str
    rule: Rule
    deadline: datetime
    fired_at: datetime


class AutoTerminator:
    def __init__(
        self,
        ctx: Context,
        runtime: Runtime | Callable[[int | None], Runtime],
        *,
        gpu_utilization: GpuUtilization = nvml_utilization,
        on_fire: Callable[[Fired], None] | None = None,
        training: TrainingAutoTerminator | None = None,
    ) -> None:
        """``on_fire``: told of each cluster a rule terminated or stopped (metrics).
        ``training``: training clusters' policies (None: this server runs no training
        clusters)."""
        self.ctx = ctx
        # The engine of a cluster's host (a fleet's lookup), or one for every host.
        if callable(runtime):
            self.runtime_of: Callable[[int | None], Runtime] = runtime
        else:
            single = runtime
            self.runtime_of = lambda _host_id: single
        self.gpu_utilization = gpu_utilization
        self.on_fire = on_fire
        self.idle_since = ctx.idle_since
        self.next_due: datetime | None = None
        self._last_sample = float("-inf")
        # Running clusters with a policy, and the versions last read of all running ones.
        self._watch: dict[str, _Watched] = {}
        self._seen: dict[str, int] = {}
        # The problem last reported per cluster, so each is logged and recorded once.
        self._reported: dict[str, str] = {}
        # The fence of the duty's lease the last run was done under (several replicas).
        self._fence: int | None = None
        # The running clusters' aggregate when last read in full, and when that was.
        self._fingerprint: tuple[object, ...] | None = None
        self._full_read_at = float("-inf")
        # A deadline came but did not fire (changed meanwhile, or failed): plan again.
        self._retry = False
        self.training = training

    # -- public --------------------------------------------------------------------
    def seconds_until_next(self) -> float | None:
        dues = [self.next_due]
        if self.training is not None:
            dues.append(self.training.next_due)
        known = [d for d in dues if d is not None]
        if not known:
            return None
        return max(0.0, (min(known) - self.ctx.clock.now()).total_seconds())

    def run(self, *, sample: bool | None = None, fence: int | None = None) -> list[Fired]:
        """Fire every deadline that is due, clusters' and training clusters'; remember
        the next one (see :meth:`run_clusters` for ``sample`` and ``fence``). A failure
        of the training side is logged and never stops the clusters' watch."""
        fired = self.run_clusters(sample=sample, fence=fence)
        if self.training is None:
            return fired
        try:
            done = self.training.run(sample=sample, fence=fence)
        except Exception:
            log.exception("training auto-termination pass failed")
            return fired
        for t in done:
            f = Fired(training_domain.cluster_owner(t.cluster_id), t.rule, t.deadline, t.fired_at)
            fired.append(f)
            if self.on_fire is not None:
                self.on_fire(f)
        return fired

    def run_clusters(self, *, sample: bool | None = None, fence: int | None = None) -> list[Fired]:
        """Fire every deadline that is due; remember the next one. ``sample`` forces
        (or suppresses) an idleness sample; by default one is taken when due.

        ``fence``: the fence of the auto-termination lease this run is done under
        (services/installation/leases.py), when replicas share the duty. A fence other than the last
        run's means another replica held the duty in between and may have seen the
        clusters busy: the idle windows sampled before are dropped and start again, so
        a handover can delay an idle stop, never bring one forward."""
        dirty = self._retry
        if fence is not None and fence != self._fence:
            self.idle_since.clear()
            self._fence = fence
            dirty = True
        dirty = self._refresh() or dirty
        interval = self.ctx.settings.idle_sample_interval_s
        due_sample = time.monotonic() - self._last_sample >= interval
        if sample or (sample is None and due_sample):
            self._last_sample = time.monotonic()
            self._sample_idle([e.cluster for e in self._watch.values() if e.policy.idle_minutes])
            dirty = True
        now = self.ctx.clock.now()
        if not dirty and (self.next_due is None or now < self.next_due):
            # Nothing read, sampled or fired since the last plan, and its first deadline
            # has not come: the plan stands (no walk over every watched cluster).
            return []
        self._retry = False
        fired: list[Fired] = []
        next_due: datetime | None = None
        for entry in list(self._watch.values()):
            cid = entry.cluster.id
            try:
                first = entry.first(self.idle_since.get(cid))
                if first is None:
                    continue
                if first.at <= now:
                    if self._fire(entry.cluster, entry.policy, entry.rate, first, now):
                        fired.append(Fired(cid, first.rule, first.at, now))
                        self._watch.pop(cid, None)
                    else:
                        self._retry = True  # still due: the next pass looks again
                elif next_due is None or first.at < next_due:
                    next_due = first.at
            except Exception as exc:  # this cluster's failure is its own (next pass retries)
                self._retry = True
                self._report(cid, f"auto-termination failed: {type(exc).__name__}: {exc}", exc)
        for cid in list(self.idle_since):
            if cid not in self._watch:
                del self.idle_since[cid]
        for cid in [c for c in self._reported if c not in self._seen]:
            del self._reported[cid]
        self.next_due = next_due
        return fired

    # -- internals -----------------------------------------------------------------
    def _refresh(self) -> bool:
        """Bring the watched set up to date; whether anything in it may have changed.

        First one aggregate over the running clusters (through the status index, no
        row reaches Python): while it and the time of the last full read are recent,
        nothing is read. Otherwise one light query of running clusters' versions, full
        rows only for the new or changed ones (a pass over 10,000 unchanged clusters
        reads 10,000 small tuples, nothing more)."""
        problems: list[tuple[str, str, BaseException | None]] = []
        with self.ctx.connect() as conn:
            fingerprint = tuple(conn.execute(_RUNNING_FINGERPRINT).one())
            fresh = time.monotonic() - self._full_read_at < FULL_READ_EVERY_S
            if fingerprint == self._fingerprint and fresh:
                return False
            self._full_read_at = time.monotonic()
            self._fingerprint = fingerprint
            changed = self._refresh_rows(conn, _RUNNING_VERSIONS, problems)
        # Reported after the read connection is closed (each report is a write).
        for cid, problem, exc in problems:
            self._report(cid, problem, exc)
        return changed or bool(problems)

    def _refresh_rows(
        self,
        conn: Connection,
        running: Select[str, int],
        problems: list[tuple[str, str, BaseException | None]],
    ) -> bool:
        """Update the watched set from one connection; collect what to report. Whether
        a cluster came, went or changed."""
        versions = {cid: version for cid, version in conn.execute(running)}
        gone = [c for c in self._seen if c not in versions]
        for cid in [c for c in self._watch if c not in versions]:
            del self._watch[cid]
        stale = [
            cid
            for cid, version in versions.items()
            if cid not in self._seen or self._seen[cid] != version
        ]
        self._seen = versions
        if not stale:
            return bool(gone)
        _, gpus = self.ctx.references.get(conn)
        for start in range(0, len(stale), 500):
            for cid, row in self._rows(conn, stale[start : start + 500]):
                try:
                    if row is None:
                        raise LookupError("its row could not be read")
                    error = self._track(cast(Cluster, row), gpus)
                    if error is not None:
                        problems.append((cid, f"policy not enforced: {error}", None))
                except Exception as exc:  # one bad row never unwatches the others
                    self._watch.pop(cid, None)
                    self._seen.pop(cid, None)  # read it again next pass
                    self._fingerprint = None
                    problems.append((cid, f"not watched: {type(exc).__name__}: {exc}", exc))
        return True

    def _rows(self, conn: Connection, ids: list[str]) -> list[tuple[str, object | None]]:
        """The full rows of ``ids``; when the batch cannot be read (a row the driver
        cannot decode), each row alone, None for those that still fail."""
        columns = select(*Cluster.__table__.columns)
        try:
            return [(row.id, row) for row in conn.execute(columns.where(Cluster.id.in_(ids)))]
        except Exception:
            conn.rollback()
        out: list[tuple[str, object | None]] = []
        for cid in ids:
            try:
                out.append((cid, conn.execute(columns.where(Cluster.id == cid)).first()))
            except Exception:
                conn.rollback()
                out.append((cid, None))
        return out

    def _track(self, cluster: Cluster, gpus: dict[str, GpuTypeInfo]) -> str | None:
        """Watch (or stop watching) one running cluster after reading its row; the
        reason its stored policy is not enforced, None when it is valid."""
        stored = read_policy(cluster.auto_terminate)
        if stored.policy is None or cluster.status != ClusterStatus.RUNNING:
            self._watch.pop(cluster.id, None)
            return stored.error
        gpu = gpus.get(cluster.gpu_type) if cluster.gpu_type else None
        rate = cluster_rate(cluster, gpu, self.ctx.settings.prices, running=True)
        self._watch[cluster.id] = _Watched(cluster, stored.policy, rate.total)
        self._reported.pop(cluster.id, None)
        return None

    def _report(self, cluster_id: str, problem: str, exc: BaseException | None = None) -> None:
        """Log ``problem`` and record it as an event on the cluster, once per problem
        (also across restarts: not when the cluster's latest such event says it)."""
        if self._reported.get(cluster_id) == problem:
            return
        self._reported[cluster_id] = problem
        log.warning("cluster %s: auto-termination %s", cluster_id, problem, exc_info=exc)
        try:
            with self.ctx.transaction() as session:
                last = session.scalar(
                    select(Event.message)
                    .where(Event.cluster_id == cluster_id, Event.type == "auto_terminate")
                    .order_by(Event.id.desc())
                    .limit(1)
                )
                if last != problem:
                    record_event(
                        session, cluster_id, self.ctx.clock.now(), "auto_terminate", problem
                    )
        except Exception:  # the log line above is the record then
            log.exception("cluster %s: could not record the auto-termination problem", cluster_id)

    def _sample_idle(self, clusters: list[Cluster]) -> None:
        s = self.ctx.settings
        now = self.ctx.clock.now()
        try:
            uuids_of = self.gpu_uuids(clusters)
        except Exception as exc:  # no UUIDs: each cluster reports it below
            log.debug("cannot read GPU UUIDs: %s", exc)
            uuids_of = None
        for cluster in clusters:
            try:
                stats = self.runtime_of(cluster.host_id).stats(cluster.id, "idle")
            except GpuyardError as exc:
                log.debug("no stats for %s: %s", cluster.id, exc.message)
                continue
            except Exception as exc:  # one engine's failure is this cluster's alone
                self._report(cluster.id, f"idle sample failed: {type(exc).__name__}", exc)
                continue
            if stats is None:
                continue
            try:
                if uuids_of is None:
                    raise LookupError("the GPUs' UUIDs could not be read")
                utilization = self.gpu_utilization(uuids_of.get(cluster.id, ())) or []
            except Exception as exc:
                self._report(cluster.id, f"GPU utilisation failed: {type(exc).__name__}", exc)
                continue
            idle = stats.cpu_percent < s.idle_cpu_percent and all(
                u < s.idle_gpu_percent for u in utilization
            )
            if not idle:
                self.idle_since.pop(cluster.id, None)
            else:
                self.idle_since.setdefault(cluster.id, now)

    def gpu_uuids(self, clusters: list[Cluster]) -> dict[str, tuple[str, ...]]:
        """The UUIDs of each cluster's GPUs (those known), in GPU index order: one read
        of the hosts' GPUs for the whole sample, not a query per cluster."""
        hosts = {c.host_id for c in clusters if c.host_id is not None and c.gpu_indices}
        if not hosts:
            return {}
        with self.ctx.read() as session:
            known = {
                (host_id, index): uuid
                for host_id, index, uuid in session.execute(
                    select(HostGpu.host_id, HostGpu.gpu_index, HostGpu.uuid).where(
                        HostGpu.host_id.in_(hosts), HostGpu.uuid.is_not(None)
                    )
                )
                if uuid
            }
        out: dict[str, tuple[str, ...]] = {}
        for c in clusters:
            if c.host_id is None or not c.gpu_indices:
                continue
            found = (known.get((c.host_id, int(i))) for i in sorted(c.gpu_indices))
            out[c.id] = tuple(u for u in found if u)
        return out

    def _fire(
        self,
        row: Cluster,
        policy: AutoTerminatePolicy,
        rate: float,
        deadline: Deadline,
        now: datetime,
    ) -> bool:
        reason = deadline.reason(
            run_started_at=run_start(row), fired_at=now, rate=rate, policy=policy
        )
        target = (
            ClusterStatus.TERMINATING if deadline.action == "terminate" else ClusterStatus.STOPPING
        )
        desired = (
            ClusterStatus.TERMINATED if deadline.action == "terminate" else ClusterStatus.STOPPED
        )
        try:
            with self.ctx.transaction() as session:
                cluster = session.get(Cluster, row.id)
                if cluster is None or cluster.version != row.version:
                    return False  # changed since read: the next pass decides again
                session.expunge(cluster)
                transition_cluster(
                    session, cluster, target, reason, now, desired_status=desired.value
                )
                record_event(session, cluster.id, now, "auto_terminate", _detail(deadline, now))
        except Conflict:
            return False
        log.info("cluster %s: %s", row.id, reason)
        self.idle_since.pop(row.id, None)
        self.ctx.wake()
        if self.on_fire is not None:
            self.on_fire(Fired(row.id, deadline.rule, deadline.at, now))
        return True


def _detail(deadline: Deadline, now: datetime) -> str:
    lag = (now - deadline.at).total_seconds()
    return f"rule {deadline.rule.value} due at {deadline.at.isoformat()} fired {lag:.3f} s later"
