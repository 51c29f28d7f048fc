"""The work queue: one job per key, lanes that do not wait on each other, per-key
exponential back-off on failures (injected clock)."""

from __future__ import annotations

import threading
import time

import pytest

from gpuyard.reconciler.workqueue import Backoff, WorkQueue


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def wait_for(predicate: object, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.005)
    raise AssertionError("condition not met in time")


def test_backoff_doubles_and_caps() -> None:
    b = Backoff(base_s=1, max_s=300)
    assert [b.delay(n) for n in (0, 1, 2, 3, 9, 10, 500)] == [0, 1, 2, 4, 256, 300, 300]


def test_one_job_per_key_and_a_rerun_after_it() -> None:
    q = WorkQueue({"slow": 4})
    gate = threading.Event()
    runs: list[int] = []

    def job() -> None:
        runs.append(1)
        gate.wait(5)

    q.submit("a", "slow", job)
    q.submit("a", "slow", job)
    q.submit("a", "slow", job)
    wait_for(lambda: len(runs) == 1)
    time.sleep(0.05)
    assert len(runs) == 1  # never twice at once
    gate.set()
    wait_for(lambda: len(runs) == 2 and not q.busy())
    time.sleep(0.05)
    assert len(runs) == 2  # the submissions during the run collapse into one rerun
    q.close()


def test_urgent_lane_is_not_queued_behind_hung_slow_work() -> None:
    q = WorkQueue({"slow": 1, "urgent": 1})
    hang = threading.Event()
    done = threading.Event()
    q.submit("pull-a", "slow", lambda: hang.wait(10))
    q.submit("pull-b", "slow", lambda: hang.wait(10))  # queued behind the first
    q.submit("stop-c", "urgent", done.set)
    assert done.wait(2), "an urgent job waited for slow work"
    hang.set()
    q.close()


def test_failures_back_off_per_key() -> None:
    clock = Clock()
    q = WorkQueue({"slow": 2}, backoff=Backoff(base_s=10, max_s=40), clock=clock)
    calls: list[str] = []
    fail = {"bad": True}

    def bad() -> None:
        calls.append("bad")
        if fail["bad"]:
            raise RuntimeError("engine trouble")

    q.submit("bad", "slow", bad)
    wait_for(lambda: q.failures("bad") == 1)
    q.submit("bad", "slow", bad)  # during the back-off: held, not run
    q.submit("good", "slow", lambda: calls.append("good"))  # other keys are not held
    wait_for(lambda: "good" in calls)
    assert calls.count("bad") == 1
    clock.t += 10
    fail["bad"] = False
    q.submit("bad", "slow", bad)
    wait_for(lambda: calls.count("bad") == 2 and q.failures("bad") == 0)
    q.close()


def test_unknown_lane_is_refused() -> None:
    q = WorkQueue({"slow": 1})
    with pytest.raises(ValueError):
        q.submit("k", "fast", lambda: None)
    q.close()
    assert q.submit("k", "slow", lambda: None) is False


def test_a_lane_made_on_first_use_after_close_is_no_error() -> None:
    # A host first worked on while the server shuts down: its lane is not made any
    # more, and the submission is declined like any other after close.
    q = WorkQueue({"slow": 1})
    q.close()
    q.ensure_lane("slow:host:1", 1)
    assert q.submit("k", "slow:host:1", lambda: None) is False


def test_a_database_outage_is_one_warning_and_retried(caplog: pytest.LogCaptureFixture) -> None:
    import psycopg
    from sqlalchemy.exc import OperationalError

    q = WorkQueue({"slow": 1}, backoff=Backoff(base_s=0, max_s=0))
    runs: list[int] = []

    def job() -> None:
        runs.append(1)
        if len(runs) == 1:  # a failover: the first try meets no database
            raise OperationalError("SELECT 1", {}, psycopg.OperationalError("refused"))

    with caplog.at_level("WARNING", logger="gpuyard.reconciler.workqueue"):
        q.submit("a", "slow", job)
        # Retried after its back-off (none here), and done then.
        wait_for(lambda: len(runs) == 2 and q.failures("a") == 0 and not q.busy())
    q.close()
    outage = [r for r in caplog.records if "waits for the database" in r.getMessage()]
    assert len(outage) == 1 and outage[0].levelname == "WARNING"
    assert outage[0].exc_info is None  # no stack trace for an outage
