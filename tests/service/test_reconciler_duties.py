"""Wakes run the lifecycle work at once and the duties (auto-termination, budgets,
serverless scaling) at most every DUTY_GAP_S; a duty run skipped on a wake is owed
and made, so a change never waits for the reconcile interval. Real loop thread, real
database, fake runtime; events, no sleeps."""

from __future__ import annotations

import threading
from collections.abc import Callable

from sqlalchemy.exc import OperationalError

from gpuyard.reconciler.loop import FAILED_PASS_RETRY_S, Reconciler


class Counting:
    """Wraps a duty's ``run``: counts calls and signals each one."""

    def __init__(self, run: Callable[..., object]) -> None:
        self._run = run
        self.calls = 0
        self.called = threading.Condition()

    def __call__(self, *args: object, **kwargs: object) -> object:
        with self.called:
            self.calls += 1
            self.called.notify_all()
        return self._run(*args, **kwargs)

    def wait_beyond(self, n: int, timeout_s: float) -> bool:
        with self.called:
            return self.called.wait_for(lambda: self.calls > n, timeout_s)


def test_a_duty_skipped_on_a_wake_is_made_soon_after(rec: Reconciler) -> None:
    # Only wakes and owed runs end the loop's sleep.
    rec.ctx.settings.reconcile_interval_s = 3600.0
    # Longer than any machine's uptime (the monotonic clock counts from boot): the
    # first pass still comes at once, with its heartbeat.
    rec.heartbeat_every_s = 1e9
    budget = Counting(rec.budget.run)
    rec.budget.run = budget  # type: ignore[method-assign]
    passes = threading.Semaphore(0)
    rec.on_pass = lambda _lag, _took: passes.release()
    rec.start()
    try:
        assert passes.acquire(timeout=30)  # the first pass, which runs the duties
        for _ in range(5):  # wakes in quick succession: most skip the duties
            rec.wake()
            assert passes.acquire(timeout=30)
        seen = budget.calls
        rec.wake()
        # Whether that pass ran them or owed them, a run follows the last wake.
        assert budget.wait_beyond(seen, 30)
    finally:
        rec.stop()


def test_after_a_failed_pass_the_loop_waits_before_the_next(rec: Reconciler) -> None:
    """The database away (a failover): the pass fails before its heartbeat, which
    stays due, so the loop would retry at once, over and over. It waits a little."""
    rec.ctx.settings.reconcile_interval_s = 3600.0
    assert rec.next_sleep_s() == 0.0  # the first pass heartbeats: due at once

    def lost(**_kwargs: object) -> None:
        raise OperationalError("SELECT 1", {}, Exception("server closed the connection"))

    rec.run_pass = lost  # type: ignore[method-assign]
    passes = threading.Semaphore(0)
    rec.on_pass = lambda _lag, _took: passes.release()
    rec.start()
    try:
        assert passes.acquire(timeout=30)
        assert rec.next_sleep_s() >= FAILED_PASS_RETRY_S
    finally:
        rec.stop()
