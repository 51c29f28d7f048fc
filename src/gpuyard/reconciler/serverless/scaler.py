"""The serverless scaler: each pass (and promptly after a wake-up, since every pass
runs it), for every active or deleting endpoint, it

1. lets the queue sweep (lost pings, timeouts, expiry: workers to replace are set to
   ``recycle``);
2. brings worker rows in line with their clusters (steps.py ``settle``): a worker
   whose container died gives its jobs back and is gone, one whose cluster was stopped
   under it (a spent budget) too, or is kept stopped with flashboot;
3. decides how many workers the queue wants (core/serverless/scaling.py: RunPod's
   two scalers, ``workers_min..workers_max``, never below the busy ones) and starts
   them (kept ones first with flashboot) or stops the idle ones past
   ``idle_timeout_s`` (flashboot: stopped and kept; else terminated);
4. records why it could not start what it wanted (``capacity_problem``: a quota, a
   spent budget, no host with the GPU type) and clears it once nothing is in the way;
5. for a deleting endpoint whose queue is empty: terminates every worker, kept ones
   too, and the endpoint is deleted.

Workers are clusters created through the clusters' create use case as the endpoint's
account (placement, quotas, budget admission and metering as for any cluster), marked
as the endpoint's (left out of the user's lists, refused to the user's actions).
One endpoint's trouble is logged and never holds up the others.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from sqlalchemy import select, update

from gpuyard.core.errors import GpuyardError
from gpuyard.core.serverless.scaling import (
    CapacityLimit,
    Decision,
    ScalerType,
    ScalingPolicy,
    decide,
)
from gpuyard.reconciler.serverless.ports import QueuePort
from gpuyard.reconciler.serverless.steps import Outcome, WorkerSteps
from gpuyard.services.billing.admission import refuse_closed_account
from gpuyard.services.context import Context
from gpuyard.services.serverless import workers as rows
from gpuyard.store.schema import ServerlessEndpoint

log = logging.getLogger(__name__)

ACTIVE = "active"
DELETING = "deleting"
DELETED = "deleted"
# How soon the next pass is wanted while an endpoint has jobs or workers: queue delay
# and idle time are judged in seconds.
BUSY_RECHECK_S = 1.0


@dataclass
class EndpointPass:
    """What one pass did to one endpoint."""

    endpoint_id: str
    decision: Decision | None = None
    outcome: Outcome = field(default_factory=Outcome)
    capacity_problem: str | None = None
    deleted: bool = False


def policy_of(endpoint: ServerlessEndpoint) -> ScalingPolicy:
    try:
        scaler = ScalerType(endpoint.scaler_type)
    except ValueError:
        scaler = ScalerType.QUEUE_DELAY
    return ScalingPolicy(
        scaler_type=scaler,
        scaler_value=endpoint.scaler_value,
        workers_min=endpoint.workers_min if endpoint.status == ACTIVE else 0,
        workers_max=endpoint.workers_max,
        idle_timeout_s=endpoint.idle_timeout_s,
    )


class ServerlessScaler:
    """``queue``: the job queue's side (ports.QueuePort). ``base_url``: where workers'
    containers reach this server (services/serverless/callback.py). ``max_retries``:
    how often a job is given back before it fails."""

    def __init__(
        self, ctx: Context, queue: QueuePort, *, base_url: str, max_retries: int = 3
    ) -> None:
        self.ctx = ctx
        self.queue = queue
        self.steps = WorkerSteps(ctx, queue, base_url, max_retries)
        self._busy = False

    def seconds_until_next(self) -> float | None:
        """While an endpoint has jobs or workers, the next pass is wanted soon."""
        return BUSY_RECHECK_S if self._busy else None

    def run(self) -> list[EndpointPass]:
        """One pass over every active or deleting endpoint."""
        now = self.ctx.clock.now()
        try:
            self.queue.sweep(self.ctx, now)
        except Exception:  # the scaling goes on; the sweep is retried next pass
            log.exception("serverless queue sweep failed")
        with self.ctx.read() as session:
            ids = list(
                session.scalars(
                    select(ServerlessEndpoint.id)
                    .where(ServerlessEndpoint.status.in_([ACTIVE, DELETING]))
                    .order_by(ServerlessEndpoint.id)
                )
            )
        passes: list[EndpointPass] = []
        busy = False
        for endpoint_id in ids:
            try:
                done = self.run_endpoint(endpoint_id)
            except Exception:  # this endpoint's trouble is its own; retried next pass
                log.exception("serverless endpoint %s: scaling pass failed", endpoint_id)
                busy = True
                continue
            passes.append(done)
            d = done.decision
            busy = busy or bool(d is not None and (d.desired or d.start or d.stop))
        self._busy = busy
        return passes

    def run_endpoint(self, endpoint_id: str) -> EndpointPass:
        """One endpoint's pass (see the module's docstring)."""
        result = EndpointPass(endpoint_id)
        out = result.outcome
        with self.ctx.read() as session:
            endpoint = session.get(ServerlessEndpoint, endpoint_id)
            if endpoint is None or endpoint.status not in (ACTIVE, DELETING):
                return result
            session.expunge(endpoint)
            watched = rows.watched_workers(session, endpoint_id)
        for w in watched:
            self.steps.settle(endpoint, w, out)
        now = self.ctx.clock.now()
        with self.ctx.read() as session:
            queue = self.queue.queue_state(session, endpoint_id, now)
            watched = rows.watched_workers(session, endpoint_id)
        if endpoint.status == DELETING and queue.in_queue == 0 and queue.in_progress == 0:
            self.steps.drain(endpoint, watched, out)
            result.deleted = self._finish_delete(endpoint_id)
            return result
        live = [w for w in watched if w.status in rows.LIVE]
        states = [w.state() for w in live]
        capacity = self._capacity(endpoint, len([s for s in states if s.status != "stopping"]))
        decision = decide(policy_of(endpoint), queue, states, capacity, now)
        result.decision = decision
        by_id = {w.worker_id: w for w in live}
        for worker_id in decision.stop:
            self.steps.stop_idle(endpoint, by_id[worker_id], out)
        refusal = None
        if decision.start:
            kept = [
                w
                for w in watched
                if w.status == rows.STOPPED
                and w.cluster_status == "stopped"
                and w.endpoint_version == endpoint.version
            ]
            kept = kept if endpoint.flashboot else []
            refusal = self.steps.start(endpoint, decision.start, kept, out)
        result.capacity_problem = refusal or decision.capacity_problem
        self._record_problem(endpoint, result.capacity_problem)
        return result

    def _capacity(self, endpoint: ServerlessEndpoint, running: int) -> CapacityLimit:
        """No new worker while the account may take no new work (suspended, its
        budget or balance spent): the workers running now are the limit, and why."""
        try:
            with self.ctx.read() as session:
                refuse_closed_account(session, endpoint.account_id)
        except GpuyardError as exc:
            return CapacityLimit(max_workers=running, reason=exc.message)
        return CapacityLimit()

    def _record_problem(self, endpoint: ServerlessEndpoint, problem: str | None) -> None:
        if endpoint.capacity_problem == problem:
            return
        with self.ctx.transaction() as session:
            session.execute(
                update(ServerlessEndpoint)
                .where(ServerlessEndpoint.id == endpoint.id)
                .values(capacity_problem=problem)
            )
        if problem is not None:
            log.info("serverless endpoint %s: %s", endpoint.id, problem)

    def _finish_delete(self, endpoint_id: str) -> bool:
        """The drained endpoint is deleted (its rows kept: jobs' results, billing)."""
        now = self.ctx.clock.now()
        with self.ctx.transaction() as session:
            result = session.execute(
                update(ServerlessEndpoint)
                .where(ServerlessEndpoint.id == endpoint_id, ServerlessEndpoint.status == DELETING)
                .values(status=DELETED, updated_at=now, capacity_problem=None)
                .execution_options(synchronize_session=False)
            )
        return bool(getattr(result, "rowcount", 0))
