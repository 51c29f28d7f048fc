"""How many workers an endpoint wants, pure (RunPod's two scalers).

- QUEUE_DELAY: add a worker while the oldest queued job has waited more than
  ``scaler_value`` seconds (one more per pass, so a burst is met step by step rather
  than by a fleet at once); hold the count while jobs wait less.
- REQUEST_COUNT: ``ceil((in_queue + in_progress) / scaler_value)`` workers.

Either way the count is clamped to ``workers_min..workers_max`` and to what capacity
allows (``CapacityLimit``: a quota, a budget, no host with the GPU type), and never
below the workers busy now (a running job is never cut off by a scale-down). Workers
idle for ``idle_timeout_s`` are the ones stopped when the count falls, oldest idle
first; busy or starting workers are never chosen.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum


class ScalerType(StrEnum):
    QUEUE_DELAY = "QUEUE_DELAY"
    REQUEST_COUNT = "REQUEST_COUNT"


@dataclass(frozen=True)
class ScalingPolicy:
    scaler_type: ScalerType
    scaler_value: int
    workers_min: int
    workers_max: int
    idle_timeout_s: int


@dataclass(frozen=True)
class QueueState:
    in_queue: int
    in_progress: int
    # When the oldest job still in the queue entered it; None: the queue is empty.
    oldest_queued_at: datetime | None


@dataclass(frozen=True)
class WorkerState:
    worker_id: str
    # starting (not yet taking jobs), ready, stopping
    status: str
    jobs_in_progress: int
    # The last time it took or finished a job (or became ready); idle time runs from here.
    last_busy_at: datetime | None

    def idle_since(self) -> datetime | None:
        """When it became idle, or None while it is busy or not ready."""
        if self.status != "ready" or self.jobs_in_progress > 0:
            return None
        return self.last_busy_at


@dataclass(frozen=True)
class CapacityLimit:
    """At most ``max_workers`` workers can run now (None: no limit known), and why."""

    max_workers: int | None = None
    reason: str | None = None


@dataclass(frozen=True)
class Decision:
    desired: int
    # How many new workers to start now.
    start: int
    # The idle workers to stop now, oldest idle first.
    stop: tuple[str, ...]
    # Why fewer workers run than the scaler wants (shown on the endpoint); None: none.
    capacity_problem: str | None


def wanted_by_scaler(policy: ScalingPolicy, queue: QueueState, current: int, now: datetime) -> int:
    """The scaler's count before clamping."""
    value = max(1, policy.scaler_value)
    if policy.scaler_type is ScalerType.REQUEST_COUNT:
        return math.ceil((queue.in_queue + queue.in_progress) / value)
    # QUEUE_DELAY: jobs waiting too long add one worker; any queued job keeps at least one.
    # With nothing queued the scaler wants none: decide() keeps the busy workers, and the
    # idle ones go once their idle timeout has passed (holding every worker while one job
    # still runs would keep idle workers, and their cost, for as long as jobs trickle in).
    if queue.oldest_queued_at is None:
        return 0
    waited = (now - queue.oldest_queued_at).total_seconds()
    floor = max(current, 1)
    return floor + 1 if waited > value and current > 0 else floor


def decide(
    policy: ScalingPolicy,
    queue: QueueState,
    workers: list[WorkerState],
    capacity: CapacityLimit,
    now: datetime,
) -> Decision:
    """What to start and stop now; ``workers`` are the live ones (not stopped)."""
    live = [w for w in workers if w.status != "stopping"]
    busy = sum(1 for w in live if w.jobs_in_progress > 0 or w.status == "starting")
    wanted = wanted_by_scaler(policy, queue, len(live), now)
    desired = min(max(wanted, policy.workers_min), max(policy.workers_max, 0))
    problem: str | None = None
    if capacity.max_workers is not None and desired > capacity.max_workers:
        problem = capacity.reason or "not enough capacity for more workers"
        desired = max(capacity.max_workers, 0)
    desired = max(desired, busy)
    start = max(0, desired - len(live))
    stop: tuple[str, ...] = ()
    if len(live) > desired:
        idle_long = sorted(
            (
                (since, w.worker_id)
                for w in live
                if (since := w.idle_since()) is not None
                and now - since >= timedelta(seconds=policy.idle_timeout_s)
            ),
        )
        stop = tuple(worker_id for _, worker_id in idle_long[: len(live) - desired])
    return Decision(desired=desired, start=start, stop=stop, capacity_problem=problem)
