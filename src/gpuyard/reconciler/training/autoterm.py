"""Enforcement of training clusters' auto-termination policies.

Run by the clusters' watcher (reconciler/duties/autoterminate.py ``AutoTerminator.training``)
in the same pass, under the same duty (one replica at a time): each running training
cluster with a policy gets its deadlines (services/training/autoterm.py, the clusters'
rules), and a due one stops the cluster (its Slurm state kept, as a control-plane stop)
or deletes it, with an event on the cluster and an account event that goes to the
account's webhook.

Idleness is sampled every ``idle_sample_interval_s`` from Slurm's queue on the
controller (reconciler/training/slurm_jobs.py): a cluster is idle while no job runs or waits.
Its idle clock starts at the later of the moment it entered ``running`` and the last
sample that saw a job (and never before this watcher began under its current fence:
after a restart or a handover the window starts again, which delays a stop and never
brings one forward). A queue that cannot be read counts as busy: a cluster is never
stopped on a guess; the problem is recorded once as an event.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpuyard.core.autoterm import Deadline, Rule, read_policy_as
from gpuyard.core.models import TrainingAutoTerminatePolicy
from gpuyard.core.training import clusters as domain
from gpuyard.core.training.clusters import NodeName, NodeRole, TrainingStatus
from gpuyard.reconciler.training.slurm_jobs import SlurmJobs
from gpuyard.services.billing.budgets import TRAINING_AUTO_TERMINATED, record_account_event
from gpuyard.services.clusters.lifecycle import record_event
from gpuyard.services.context import Context
from gpuyard.services.training import autoterm
from gpuyard.services.training.stops import begin_stop
from gpuyard.services.training.use_cases import begin_delete
from gpuyard.store.schema import Account, Event, TrainingCluster, TrainingNode

log = logging.getLogger(__name__)

_RUNNING = select(TrainingCluster.id, TrainingCluster.version).where(
    TrainingCluster.status == TrainingStatus.RUNNING.value,
    TrainingCluster.deleted_at.is_(None),
)
# Queue reads of several clusters at once: one slow host does not hold up the others.
SAMPLE_THREADS = 8


@dataclass(frozen=True)
class TrainingFired:
    cluster_id: int
    rule: Rule
    deadline: datetime
    fired_at: datetime


@dataclass
class _Watched:
    """A running training cluster with a policy, as read at ``version``: the deadlines
    that do not depend on idleness (runtime, cost at the rate billed when read), and
    where its controller runs."""

    cluster: TrainingCluster
    policy: TrainingAutoTerminatePolicy
    cost: autoterm.RunCost
    running_at: datetime
    controller: str
    controller_host: int | None

    def first(self, idle_since: datetime | None) -> Deadline | None:
        plan = autoterm.plan(self.cluster, self.policy, self.cost, idle_since)
        return plan[0] if plan else None


class TrainingAutoTerminator:
    def __init__(self, ctx: Context, jobs: SlurmJobs) -> None:
        self.ctx = ctx
        self.jobs = jobs
        # Since when each watched cluster has been idle (views show the countdown).
        self.idle_since = ctx.training_idle_since
        # When a sample last saw a job in each watched cluster's queue.
        self._busy_at: dict[int, datetime] = {}
        self._watch: dict[int, _Watched] = {}
        self._seen: dict[int, int] = {}
        self._reported: dict[int, str] = {}
        # When this watcher began under the current fence; idle windows start no earlier.
        self._watch_from: datetime | None = None
        self._fence: int | None = None
        self._last_sample = float("-inf")
        self.next_due: datetime | None = None

    def seconds_until_next(self) -> float | None:
        if self.next_due is None:
            return None
        return max(0.0, (self.next_due - self.ctx.clock.now()).total_seconds())

    def run(self, *, sample: bool | None = None, fence: int | None = None) -> list[TrainingFired]:
        """Fire every deadline that is due and remember the next one. ``sample`` forces
        (or suppresses) a queue sample; by default one is taken when due. ``fence``: as
        for the clusters' watcher (a new holder of the duty starts idle windows anew)."""
        if self._watch_from is None or (fence is not None and fence != self._fence):
            self.idle_since.clear()
            self._busy_at.clear()
            self._watch_from = self.ctx.clock.now()
            self._fence = fence
        self._refresh()
        interval = self.ctx.settings.idle_sample_interval_s
        due_sample = time.monotonic() - self._last_sample >= interval
        if sample or (sample is None and due_sample):
            self._last_sample = time.monotonic()
            self._sample([w for w in self._watch.values() if w.policy.idle_minutes])
        now = self.ctx.clock.now()
        fired: list[TrainingFired] = []
        next_due: datetime | None = None
        for cid, entry in list(self._watch.items()):
            try:
                first = entry.first(self.idle_since.get(cid))
                if first is None:
                    continue
                if first.at > now:
                    next_due = first.at if next_due is None else min(next_due, first.at)
                elif self._fire(entry, first, now):
                    fired.append(TrainingFired(cid, first.rule, first.at, now))
                    self._forget(cid)
                # Else it changed meanwhile: the next pass reads it again and decides.
            except Exception as exc:  # this cluster's failure is its own (next pass retries)
                self._report(cid, f"auto-termination failed: {type(exc).__name__}: {exc}", exc)
        self.next_due = next_due
        return fired

    # -- internals -----------------------------------------------------------------
    def _forget(self, cid: int) -> None:
        self._watch.pop(cid, None)
        self.idle_since.pop(cid, None)
        self._busy_at.pop(cid, None)

    def _refresh(self) -> None:
        """Bring the watched set up to date: the running clusters' versions (a small
        query), full rows only for those new or changed."""
        now = self.ctx.clock.now()
        problems: list[tuple[int, str]] = []
        with self.ctx.read() as session:
            versions = {cid: version for cid, version in session.execute(_RUNNING)}
            for cid in [c for c in self._seen if c not in versions]:
                self._forget(cid)
                self._reported.pop(cid, None)
            stale = [c for c, v in versions.items() if self._seen.get(c) != v]
            self._seen = versions
            for cid in stale:
                try:
                    problem = self._track(session, cid, now)
                except Exception as exc:  # one bad row never stops the others
                    self._forget(cid)
                    self._seen.pop(cid, None)  # read it again next pass
                    session.rollback()
                    problem = f"not watched: {type(exc).__name__}: {exc}"
                if problem is not None:
                    problems.append((cid, problem))
        # Reported after the read session is closed (each report is a write).
        for cid, problem in problems:
            self._report(cid, problem)

    def _track(self, session: Session, cid: int, now: datetime) -> str | None:
        """Watch (or stop watching) one running cluster after reading its row; why its
        stored policy is not enforced (None when it is, or when it has none)."""
        cluster = session.get(TrainingCluster, cid)
        if cluster is None:
            return None
        stored = read_policy_as(cluster.auto_terminate, TrainingAutoTerminatePolicy)
        if stored.policy is None:
            self._forget(cid)
            return None if stored.error is None else f"policy not enforced: {stored.error}"
        running_at = autoterm.running_since(session, cid) or autoterm.run_start(cluster)
        old = self._watch.get(cid)
        if old is not None and old.running_at != running_at:
            # It left running and came back in between: a new idle window.
            self.idle_since.pop(cid, None)
            self._busy_at.pop(cid, None)
        host = session.scalar(
            select(TrainingNode.host_id).where(
                TrainingNode.cluster_id == cid,
                TrainingNode.role == NodeRole.CONTROLLER.value,
            )
        )
        cost = autoterm.run_cost(session, cluster, now)
        session.expunge(cluster)
        self._watch[cid] = _Watched(
            cluster,
            stored.policy,
            cost,
            running_at,
            NodeName(cid, cluster.name_prefix).controller,
            host if host is not None else cluster.host_id,
        )
        return None

    def _sample(self, entries: list[_Watched]) -> None:
        if not entries:
            return
        with ThreadPoolExecutor(max_workers=min(SAMPLE_THREADS, len(entries))) as pool:
            counts = list(pool.map(self._active_jobs, entries))
        now = self.ctx.clock.now()
        for entry, count in zip(entries, counts, strict=True):
            cid = entry.cluster.id
            if isinstance(count, Exception):
                self._report(cid, f"idle sample failed (counted as busy): {count}"[:500])
            if count != 0:  # jobs, or the queue could not be read
                self._busy_at[cid] = now
                self.idle_since.pop(cid, None)
            elif cid not in self.idle_since:
                starts = [entry.running_at, self._busy_at.get(cid), self._watch_from]
                self.idle_since[cid] = max(t for t in starts if t is not None)

    def _active_jobs(self, entry: _Watched) -> int | Exception:
        """How many jobs run or wait; the error when the queue could not be read."""
        try:
            return self.jobs.active_jobs(entry.controller_host, entry.controller)
        except Exception as exc:  # reported by the caller, in the watcher's thread
            return exc

    def _fire(self, entry: _Watched, deadline: Deadline, now: datetime) -> bool:
        """Stop or delete the cluster for ``deadline`` in one transaction, unless it
        changed since it was read; record the firing (an event on the cluster, an
        account event and its webhook)."""
        row = entry.cluster
        with self.ctx.transaction() as session:
            cluster = session.get(TrainingCluster, row.id, with_for_update=True)
            if (
                cluster is None
                or cluster.deleted_at is not None
                or cluster.version != row.version
                or cluster.status != TrainingStatus.RUNNING
            ):
                return False
            cost = autoterm.run_cost(session, cluster, now)
            reason = deadline.reason(
                run_started_at=autoterm.run_start(cluster),
                fired_at=now,
                rate=cost.rate_usd,
                policy=entry.policy,
                spent=cost.spent_usd,
            )
            if deadline.rule == Rule.IDLE:
                reason += " (no running or pending Slurm job)"
            if deadline.action == "delete":
                begin_delete(session, cluster, reason, now)
            else:
                begin_stop(session, cluster, reason, now)
            lag = (now - deadline.at).total_seconds()
            detail = (
                f"rule {deadline.rule.value} due at {deadline.at.isoformat()} "
                f"fired {lag:.3f} s later"
            )
            record_event(session, domain.cluster_owner(cluster.id), now, autoterm.EVENT, detail)
            account = session.get(Account, cluster.account_id)
            if account is not None:
                record_account_event(
                    session,
                    account,
                    TRAINING_AUTO_TERMINATED,
                    f"training cluster {cluster.id} ({cluster.name}): {reason}",
                    now,
                    detail={
                        "training_cluster_id": cluster.id,
                        "project_id": cluster.project_id,
                        "location": cluster.location,
                        "rule": deadline.rule.value,
                        "action": deadline.action,
                        "deadline_at": deadline.at.isoformat().replace("+00:00", "Z"),
                        "spent_usd": round(cost.spent_usd, 6),
                    },
                )
        log.info("training cluster %s: %s", row.id, reason)
        self.ctx.training_wake(row.id)
        return True

    def _report(self, cluster_id: int, problem: str, exc: BaseException | None = None) -> None:
        """Log ``problem`` and record it as an event on the cluster, once per problem
        (also across restarts: not when its latest such event says it)."""
        if self._reported.get(cluster_id) == problem:
            return
        self._reported[cluster_id] = problem
        log.warning("training cluster %s: auto-termination %s", cluster_id, problem, exc_info=exc)
        owner = domain.cluster_owner(cluster_id)
        try:
            with self.ctx.transaction() as session:
                last = session.scalar(
                    select(Event.message)
                    .where(Event.cluster_id == owner, Event.type == autoterm.EVENT)
                    .order_by(Event.id.desc())
                    .limit(1)
                )
                if last != problem:
                    record_event(session, owner, self.ctx.clock.now(), autoterm.EVENT, problem)
        except Exception:  # the log line above is the record then
            log.exception("training cluster %s: could not record a problem", cluster_id)
