"""Enforcement of auto-termination policies.

Each pass computes every running cluster's earliest deadline (core/autoterm.py) and
fires the ones due: the cluster moves to ``stopping`` (or ``terminating``) through
the status funnel with the rule and figures as the reason. The reconciler sleeps no
longer than until the next deadline, so a rule fires within a fraction of a second
of its time — also for deadlines that passed while the server was down (the first
pass after start fires them). Idleness is sampled from the engine's stats and GPU
utilisation every ``idle_sample_interval_s``; a cluster is idle when its CPU and
every one of its GPUs are under their thresholds.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from sqlalchemy import select

from gpuyard.core.autoterm import Deadline, Rule, deadlines, parse_policy
from gpuyard.core.errors import Conflict, GpuyardError
from gpuyard.core.models import AutoTerminatePolicy
from gpuyard.core.states import ClusterStatus
from gpuyard.runtimes.base import Runtime
from gpuyard.services.cluster_views import cluster_rate
from gpuyard.services.context import Context
from gpuyard.services.hosts import gpu_uuids
from gpuyard.services.lifecycle import record_event, transition_cluster
from gpuyard.store.schema import Cluster

log = logging.getLogger(__name__)

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
        runtime: Runtime,
        *,
        gpu_utilization: GpuUtilization = nvml_utilization,
        on_fire: Callable[[Fired], None] | None = None,
    ) -> None:
        self.ctx = ctx
        self.runtime = runtime
        self.gpu_utilization = gpu_utilization
        self.on_fire = on_fire
        self.idle_since = ctx.idle_since
        self.next_due: datetime | None = None
        self._last_sample = float("-inf")

    # -- public --------------------------------------------------------------------
    def seconds_until_next(self) -> float | None:
        if self.next_due is None:
            return None
        return max(0.0, (self.next_due - self.ctx.clock.now()).total_seconds())

    def run(self, *, sample: bool | None = None) -> list[Fired]:
        """Fire every deadline that is due; remember the next one. ``sample`` forces
        (or suppresses) an idleness sample; by default one is taken when due."""
        rows = self._candidates()
        due_sample = (
            time.monotonic() - self._last_sample >= self.ctx.settings.idle_sample_interval_s
        )
        if sample or (sample is None and due_sample):
            self._last_sample = time.monotonic()
            self._sample_idle([r for r in rows if r[1].idle_minutes])
        now = self.ctx.clock.now()
        fired: list[Fired] = []
        next_due: datetime | None = None
        for cluster, policy, rate in rows:
            plan = deadlines(
                policy,
                run_started_at=self._run_start(cluster),
                hourly_rate=rate,
                idle_since=self.idle_since.get(cluster.id),
            )
            if not plan:
                continue
            first = plan[0]
            if first.at <= now:
                if self._fire(cluster, policy, rate, first, now):
                    fired.append(Fired(cluster.id, first.rule, first.at, now))
            elif next_due is None or first.at < next_due:
                next_due = first.at
        running = {c.id for c, _, _ in rows}
        for cid in list(self.idle_since):
            if cid not in running:
                del self.idle_since[cid]
        self.next_due = next_due
        return fired

    def next_deadline(self, cluster: Cluster) -> Deadline | None:
        """What fires next for ``cluster`` (for display), or None."""
        policy = parse_policy(cluster.auto_terminate)
        if policy is None or cluster.status != ClusterStatus.RUNNING:
            return None
        rate = self._rate(cluster)
        plan = deadlines(
            policy,
            run_started_at=self._run_start(cluster),
            hourly_rate=rate,
            idle_since=self.idle_since.get(cluster.id),
        )
        return plan[0] if plan else None

    # -- internals -----------------------------------------------------------------
    @staticmethod
    def _run_start(c: Cluster) -> datetime:
        start = c.start_initiated_at or c.started_at or c.created_at
        return start

    def _rate(self, c: Cluster) -> float:
        with self.ctx.connect() as conn:
            _, gpus = self.ctx.references.get(conn)
        gpu = gpus.get(c.gpu_type) if c.gpu_type else None
        return cluster_rate(c, gpu, self.ctx.settings.prices, running=True).total

    def _candidates(self) -> list[tuple[Cluster, AutoTerminatePolicy, float]]:
        query = select(*Cluster.__table__.columns).where(
            Cluster.status == ClusterStatus.RUNNING.value
        )
        out: list[tuple[Cluster, AutoTerminatePolicy, float]] = []
        with self.ctx.connect() as conn:
            _, gpus = self.ctx.references.get(conn)
            for row in conn.execute(query):
                cluster = cast(Cluster, row)
                policy = parse_policy(cluster.auto_terminate)
                if policy is None:
                    continue
                gpu = gpus.get(cluster.gpu_type) if cluster.gpu_type else None
                rate = cluster_rate(cluster, gpu, self.ctx.settings.prices, running=True).total
                out.append((cluster, policy, rate))
        return out

    def _sample_idle(self, rows: list[tuple[Cluster, AutoTerminatePolicy, float]]) -> None:
        s = self.ctx.settings
        now = self.ctx.clock.now()
        for cluster, _, _ in rows:
            try:
                stats = self.runtime.stats(cluster.id)
            except GpuyardError as exc:
                log.debug("no stats for %s: %s", cluster.id, exc.message)
                continue
            if stats is None:
                continue
            uuids: tuple[str, ...] = ()
            if cluster.host_id is not None and cluster.gpu_indices:
                with self.ctx.read() as session:
                    uuids = gpu_uuids(session, cluster.host_id, list(cluster.gpu_indices))
            utilization = self.gpu_utilization(uuids) or []
            idle = stats.cpu_percent < s.idle_cpu_percent and all(
                u < s.idle_gpu_percent for u in utilization
            )
            if not idle:
                self.idle_since.pop(cluster.id, None)
            else:
                self.idle_since.setdefault(cluster.id, now)

    def _fire(
        self,
        row: Cluster,
        policy: AutoTerminatePolicy,
        rate: float,
        deadline: Deadline,
        now: datetime,
    ) -> bool:
        reason = deadline.reason(
            run_started_at=self._run_start(row), fired_at=now, rate=rate, policy=policy
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


def policy_view(terminator: AutoTerminator | None, cluster: Any) -> dict[str, Any]:
    """The ``auto_terminate`` block: the stored policy plus what fires next and when."""
    block: dict[str, Any] = dict(cluster.auto_terminate or {}) or {"enabled": False}
    nxt = terminator.next_deadline(cluster) if terminator is not None else None
    block["next_deadline_at"] = nxt.at.isoformat() if nxt else None
    block["next_rule"] = nxt.rule.value if nxt else None
    return block
