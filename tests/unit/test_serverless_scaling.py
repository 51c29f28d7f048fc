"""RunPod's two scalers as a pure decision (core/serverless/scaling.py), on injected
times: the counts each scaler wants, the clamps to workers_min..workers_max and to
capacity, never fewer than the busy workers, and which idle workers are stopped."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gpuyard.core.serverless.scaling import (
    CapacityLimit,
    QueueState,
    ScalerType,
    ScalingPolicy,
    WorkerState,
    decide,
    wanted_by_scaler,
)

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
NO_LIMIT = CapacityLimit()


def policy(
    scaler: ScalerType = ScalerType.QUEUE_DELAY,
    value: int = 4,
    lo: int = 0,
    hi: int = 3,
    idle_s: int = 5,
) -> ScalingPolicy:
    return ScalingPolicy(
        scaler_type=scaler,
        scaler_value=value,
        workers_min=lo,
        workers_max=hi,
        idle_timeout_s=idle_s,
    )


def queue(in_queue: int = 0, in_progress: int = 0, waited_s: float | None = None) -> QueueState:
    oldest = None if waited_s is None else NOW - timedelta(seconds=waited_s)
    return QueueState(in_queue=in_queue, in_progress=in_progress, oldest_queued_at=oldest)


def idle(worker_id: str, for_s: float) -> WorkerState:
    return WorkerState(worker_id, "ready", 0, NOW - timedelta(seconds=for_s))


def busy(worker_id: str, jobs: int = 1) -> WorkerState:
    return WorkerState(worker_id, "ready", jobs, NOW - timedelta(seconds=1))


def starting(worker_id: str) -> WorkerState:
    return WorkerState(worker_id, "starting", 0, None)


# QUEUE_DELAY


def test_queue_delay_starts_one_worker_from_zero_for_any_queued_job() -> None:
    d = decide(policy(), queue(in_queue=1, waited_s=0), [], NO_LIMIT, NOW)
    assert (d.desired, d.start, d.stop, d.capacity_problem) == (1, 1, (), None)


def test_queue_delay_adds_one_worker_per_pass_while_the_oldest_job_waits_too_long() -> None:
    p = policy(value=4, hi=10)
    # Waited exactly the delay: not more than it, hold.
    assert wanted_by_scaler(p, queue(in_queue=20, waited_s=4), 2, NOW) == 2
    assert wanted_by_scaler(p, queue(in_queue=20, waited_s=4.001), 2, NOW) == 3
    d = decide(p, queue(in_queue=20, waited_s=9), [busy("a"), busy("b")], NO_LIMIT, NOW)
    assert (d.desired, d.start) == (3, 1)  # one more, not a fleet at once


def test_queue_delay_holds_while_jobs_wait_less_than_the_delay() -> None:
    workers = [busy("a"), idle("b", 1)]
    d = decide(policy(hi=5), queue(in_queue=3, waited_s=1), workers, NO_LIMIT, NOW)
    assert (d.desired, d.start, d.stop) == (2, 0, ())


def test_queue_delay_with_nothing_queued_lets_idle_workers_go_beside_busy_ones() -> None:
    workers = [busy("a"), idle("b", 60), idle("c", 2)]
    d = decide(policy(idle_s=5), queue(in_progress=1), workers, NO_LIMIT, NOW)
    # "a" is busy and kept; "b" idled past the timeout; "c" not yet.
    assert d.desired == 1 and d.start == 0 and d.stop == ("b",)


def test_queue_delay_scaler_value_below_one_counts_as_one() -> None:
    assert wanted_by_scaler(policy(value=0), queue(in_queue=1, waited_s=2), 1, NOW) == 2


# REQUEST_COUNT


@pytest.mark.parametrize(
    ("in_queue", "in_progress", "value", "wanted"),
    [(0, 0, 4, 0), (1, 0, 4, 1), (4, 0, 4, 1), (5, 0, 4, 2), (3, 6, 4, 3), (20, 0, 1, 20)],
)
def test_request_count_is_the_ceiling_of_jobs_over_the_value(
    in_queue: int, in_progress: int, value: int, wanted: int
) -> None:
    p = policy(ScalerType.REQUEST_COUNT, value=value, hi=100)
    assert (
        wanted_by_scaler(p, queue(in_queue, in_progress, 0 if in_queue else None), 0, NOW) == wanted
    )


def test_request_count_starts_every_worker_it_wants_at_once() -> None:
    p = policy(ScalerType.REQUEST_COUNT, value=2, hi=10)
    d = decide(p, queue(in_queue=7, waited_s=0), [starting("a")], NO_LIMIT, NOW)
    assert (d.desired, d.start) == (4, 3)  # the starting one counts as live


# Clamps


def test_never_above_workers_max() -> None:
    p = policy(ScalerType.REQUEST_COUNT, value=1, hi=3)
    d = decide(p, queue(in_queue=20, waited_s=30), [], NO_LIMIT, NOW)
    assert (d.desired, d.start, d.capacity_problem) == (3, 3, None)
    # Already at the ceiling: QUEUE_DELAY adds none however long jobs wait.
    workers = [busy("a"), busy("b"), busy("c")]
    d = decide(policy(hi=3), queue(in_queue=20, waited_s=300), workers, NO_LIMIT, NOW)
    assert (d.desired, d.start) == (3, 0)


def test_workers_min_kept_with_an_empty_queue() -> None:
    workers = [idle("a", 600), idle("b", 600), idle("c", 900)]
    d = decide(policy(lo=2, hi=5), queue(), workers, NO_LIMIT, NOW)
    assert d.desired == 2 and d.stop == ("c",)  # the one idle longest
    d = decide(policy(lo=2, hi=5), queue(), [], NO_LIMIT, NOW)
    assert (d.desired, d.start) == (2, 2)


def test_scale_to_zero_after_the_idle_timeout() -> None:
    p = policy(lo=0, idle_s=5)
    workers = [idle("a", 4.9), idle("b", 5)]
    d = decide(p, queue(), workers, NO_LIMIT, NOW)
    assert d.desired == 0 and d.stop == ("b",)  # "a" has not idled 5 s yet
    d = decide(p, queue(), workers, NO_LIMIT, NOW + timedelta(seconds=1))
    assert d.stop == ("b", "a")  # oldest idle first


def test_capacity_limit_caps_and_says_why() -> None:
    p = policy(ScalerType.REQUEST_COUNT, value=1, hi=10)
    limit = CapacityLimit(max_workers=2, reason="GPU quota of 2 reached")
    d = decide(p, queue(in_queue=8, waited_s=1), [], limit, NOW)
    assert (d.desired, d.start, d.capacity_problem) == (2, 2, "GPU quota of 2 reached")
    d = decide(p, queue(in_queue=8, waited_s=1), [], CapacityLimit(max_workers=0), NOW)
    assert d.desired == 0 and d.capacity_problem == "not enough capacity for more workers"


def test_capacity_limit_that_is_not_reached_is_no_problem() -> None:
    p = policy(ScalerType.REQUEST_COUNT, value=1, hi=10)
    d = decide(p, queue(in_queue=2, waited_s=1), [], CapacityLimit(max_workers=5), NOW)
    assert (d.desired, d.capacity_problem) == (2, None)


def test_never_below_the_busy_workers() -> None:
    # A lower workers_max (an endpoint changed) or a capacity limit cuts off no running job.
    workers = [busy("a"), busy("b", jobs=3), starting("c"), idle("d", 600)]
    d = decide(policy(hi=1), queue(in_progress=4), workers, CapacityLimit(max_workers=1), NOW)
    assert d.desired == 3 and d.start == 0
    assert d.stop == ("d",)
    # Nothing queued: the scaler wants no more, so the limit is no problem to show.
    assert d.capacity_problem is None


def test_busy_and_starting_workers_are_never_stopped() -> None:
    workers = [busy("a"), starting("b"), idle("c", 1)]
    d = decide(policy(idle_s=0), queue(), workers, NO_LIMIT, NOW)
    assert d.stop == ("c",)  # idle_timeout_s 0: an idle worker goes at once


def test_idle_stop_order_is_oldest_idle_first_and_only_as_many_as_needed() -> None:
    workers = [idle("young", 10), idle("old", 100), idle("middle", 50), idle("fresh", 1)]
    p = policy(lo=2, hi=5, idle_s=5)
    d = decide(p, queue(), workers, NO_LIMIT, NOW)
    assert d.desired == 2 and d.stop == ("old", "middle")


def test_stopping_workers_are_not_counted_as_live() -> None:
    workers = [WorkerState("gone", "stopping", 0, NOW - timedelta(seconds=100)), busy("a")]
    d = decide(policy(hi=3), queue(in_queue=1, waited_s=10), workers, NO_LIMIT, NOW)
    assert (d.desired, d.start, d.stop) == (2, 1, ())


def test_a_worker_that_is_ready_but_never_busy_idles_from_none() -> None:
    # No last_busy_at: not known to be idle, so never chosen.
    d = decide(policy(), queue(), [WorkerState("x", "ready", 0, None)], NO_LIMIT, NOW)
    assert d.desired == 0 and d.stop == ()


def test_the_decision_depends_only_on_the_injected_time() -> None:
    p = policy(lo=0, idle_s=30)
    workers = [idle("a", 0)]
    later = [NOW + timedelta(seconds=s) for s in (0, 29, 30, 31)]
    assert [decide(p, queue(), workers, NO_LIMIT, t).stop for t in later] == [
        (),
        (),
        ("a",),
        ("a",),
    ]
