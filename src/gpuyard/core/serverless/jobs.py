"""A serverless job's states and the times RunPod reports for it."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum


class JobStatus(StrEnum):
    IN_QUEUE = "IN_QUEUE"
    IN_PROGRESS = "IN_PROGRESS"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMED_OUT = "TIMED_OUT"


# A job in one of these has ended: its result is kept until it expires, nothing moves it.
FINAL_STATUSES = frozenset(
    {JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.TIMED_OUT}
)


def is_final(status: str) -> bool:
    return status in FINAL_STATUSES


def delay_time_ms(queued_at: datetime, started_at: datetime | None, now: datetime) -> int:
    """RunPod's ``delayTime``: milliseconds from entering the queue to being taken (to
    now while it still waits)."""
    end = started_at or now
    return max(0, int((end - queued_at).total_seconds() * 1000))


def execution_time_ms(
    started_at: datetime | None, completed_at: datetime | None, now: datetime
) -> int:
    """RunPod's ``executionTime``: milliseconds from being taken to the end (to now while
    it runs; 0 before it was taken)."""
    if started_at is None:
        return 0
    end = completed_at or now
    return max(0, int((end - started_at).total_seconds() * 1000))
