"""Start retries: attempts, doubling back-off, forgetting (injected clock)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gpuyard.core.errors import RuntimeFailure
from gpuyard.reconciler.clusters.start_retries import StartRetries, host_refusal


def test_attempts_back_off_then_give_up() -> None:
    now = [datetime(2026, 1, 1, tzinfo=UTC)]
    retries = StartRetries(lambda: now[0], attempts=3, first_delay_s=1.0)
    assert retries.due("c")
    assert retries.failed("c") == 1
    assert not retries.due("c")
    now[0] += timedelta(seconds=1)
    assert retries.due("c")
    assert retries.failed("c") == 2
    now[0] += timedelta(seconds=1.9)
    assert not retries.due("c")  # 2 s after the second failure
    now[0] += timedelta(seconds=0.1)
    assert retries.due("c")
    assert retries.failed("c") is None  # the third failure is the last
    assert retries.due("c") and retries.failed("c") == 1  # a new start counts anew


def test_forget_and_other_clusters() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    retries = StartRetries(lambda: now)
    retries.failed("a")
    assert not retries.due("a") and retries.due("b")
    retries.forget("a")
    assert retries.due("a")


def test_a_host_refusing_a_limit_or_a_disk_size_is_not_tried_again() -> None:
    assert host_refusal(RuntimeFailure("no pquota", {"enforces_disk": False}))
    assert host_refusal(RuntimeFailure("no cgroup", {"enforces_limits": False}))
    assert not host_refusal(RuntimeFailure("podman 500: database is locked"))
