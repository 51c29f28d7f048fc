"""The reconciler's lanes, wake-up and restart schedule, on their own."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

from gpuyard.reconciler.lanes import SLOW, Dispatcher, Wakeup
from gpuyard.reconciler.restarts import RestartSchedule
from gpuyard.runtimes.fleet import SHARED_ENGINE


def test_each_engine_gets_its_own_lanes_and_the_shared_engine_the_plain_ones() -> None:
    lanes = Dispatcher.create(2, lambda host_id: f"host:{host_id}")
    try:
        assert lanes.lane_of(SLOW, None) == SLOW
        assert lanes.lane(SLOW, SHARED_ENGINE) == SLOW
        assert lanes.lane_of(SLOW, 7) == "slow:host:7"
        ran = threading.Event()
        assert lanes.submit("job", lanes.lane_of(SLOW, 7), ran.set)
        assert ran.wait(5)
    finally:
        lanes.queue.close(wait=True)


def test_a_stopping_dispatcher_queues_no_cluster_job() -> None:
    lanes = Dispatcher.create(2, lambda host_id: f"host:{host_id}")
    try:
        lanes.wakeup.stop()
        seen: list[str] = []
        lanes.submit_cluster("c1", seen.append, SLOW, None)
        lanes.queue.close(wait=True)
        assert seen == []
    finally:
        lanes.queue.close(wait=True)


def test_wait_reports_the_first_wake_since_the_last_look() -> None:
    wakeup = Wakeup()
    assert wakeup.wait(0) is None
    wakeup.wake()
    first = wakeup.wait(5)
    assert first is not None
    assert wakeup.wait(0) is None


def test_wakes_asked_for_soon_come_once_a_moment_later() -> None:
    """A burst of finished jobs (``wake_soon``) wakes the loop once, after them."""
    wakeup = Wakeup(soon_s=0.01)
    try:
        asked = time.monotonic()
        for _ in range(3):
            wakeup.wake_soon()
        woken = wakeup.wait(5)
        assert woken is not None and woken >= asked + 0.01
        assert wakeup.wait(0.1) is None  # the three were one wake
        wakeup.wake_soon()  # and a later one is a wake of its own
        assert wakeup.wait(5) is not None
    finally:
        wakeup.stop()


def test_restarts_are_handed_out_once_when_due() -> None:
    now = [datetime(2026, 1, 1, tzinfo=UTC)]
    woken: list[bool] = []
    schedule = RestartSchedule(lambda: now[0], lambda: woken.append(True))
    assert schedule.seconds_until_next() is None
    schedule.due_at("c1", now[0] + timedelta(seconds=10))
    assert woken == [True]
    assert schedule.seconds_until_next() == 10
    assert schedule.take_due() == []
    now[0] += timedelta(seconds=11)
    assert schedule.seconds_until_next() == 0
    assert schedule.take_due() == ["c1"]
    assert schedule.take_due() == []
