"""Failed SSH logins per source address, on the API's token buckets (core/token_bucket.py).

Each source has an allowance of ``limit`` failures that refills at ``limit`` per
``window_s`` seconds: the same algorithm as the API's failed-key limit. A source whose
allowance is spent is blocked: every login from it is refused (a valid key too, so a
blocked source learns nothing from a right guess) until a failure's worth has refilled.
A failure while blocked is still counted (the bucket goes into debt, down to
``-limit``), so a source that keeps trying stays blocked. What counts as one failure is
the gateway's choice (edge/ssh_gateway.py: a connection that ends without a successful
login). Memory is bounded: at most ``max_tracked`` sources are kept, the least recently
failed dropped first, and a source whose allowance is whole again is forgotten. Not
thread-safe (one event loop uses it).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from gpuyard.core.token_bucket import BucketTable, Rate


class FailureLimiter:
    def __init__(
        self,
        limit: int,
        window_s: float = 60.0,
        *,
        max_tracked: int = 50_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``limit`` 0 turns the limiter off (nothing is ever blocked)."""
        self.limit = limit
        self.window_s = window_s
        self.max_tracked = max_tracked
        self._clock = clock
        self._table = BucketTable(Rate(limit / window_s, limit), max_tracked) if limit > 0 else None

    def blocked_for(self, source: str) -> float:
        """Seconds until ``source`` may try again; 0.0 when it is not blocked."""
        if self._table is None:
            return 0.0
        decision = self._table.peek(source, self._clock())
        return 0.0 if decision.allowed else decision.retry_after_s

    def blocked(self, source: str) -> bool:
        return self.blocked_for(source) > 0.0

    def failed(self, source: str) -> None:
        """Count one failure of ``source``."""
        if self._table is not None:
            self._table.charge(source, self._clock())

    def __len__(self) -> int:
        return 0 if self._table is None else len(self._table)
