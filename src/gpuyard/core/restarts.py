"""Desired state wins (DESIGN.md rule 9): when a container that should run has died, how
long to wait before bringing it back, and when to give up.

Pure: times are passed in, nothing is read from a clock here.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta


@dataclass(frozen=True)
class RestartPolicy:
    """Exponential back-off from ``initial_s`` doubling up to ``max_s``; after ``limit``
    failures within ``window_s`` the cluster goes to ``error`` instead."""

    initial_s: float = 1.0
    max_s: float = 300.0
    limit: int = 5
    window_s: float = 600.0

    def delay(self, failures: int) -> float:
        """Seconds to wait before the attempt that follows the ``failures``-th failure
        in the window (1 -> initial, 2 -> 2x initial, ... capped at ``max_s``)."""
        if failures <= 1:
            return min(self.initial_s, self.max_s)
        # Capped exponent: 2**64 seconds is already beyond any max_s.
        return min(self.initial_s * 2.0 ** min(failures - 1, 64), self.max_s)


@dataclass(frozen=True)
class FailureVerdict:
    """What to do about one more failure: ``give_up`` (go to error) or retry at
    ``retry_at``. ``failures`` are the failure times still inside the window."""

    failures: tuple[datetime, ...]
    give_up: bool
    retry_at: datetime


def judge_failure(
    policy: RestartPolicy, earlier: list[datetime] | tuple[datetime, ...], now: datetime
) -> FailureVerdict:
    """Count a failure at ``now`` against the earlier ones still inside the window."""
    window = timedelta(seconds=policy.window_s)
    recent = (*sorted(t for t in earlier if now - t < window), now)
    give_up = len(recent) >= policy.limit
    return FailureVerdict(
        failures=recent,
        give_up=give_up,
        retry_at=now + timedelta(seconds=policy.delay(len(recent))),
    )
