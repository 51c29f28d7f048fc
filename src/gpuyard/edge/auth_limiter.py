"""Failed SSH logins per source address: a sliding one-minute window.

A source with ``limit`` failures in the last ``window_s`` seconds is blocked: every
login from it is refused (a valid key too, so a blocked source learns nothing from a
right guess) until its oldest counted failure leaves the window. What counts as one
failure is the gateway's choice (edge/ssh_gateway.py: a connection that ends without
a successful login). Memory is bounded: at most ``max_tracked`` sources are kept, the
least recently failed dropped first. Not thread-safe (one event loop uses it).
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable


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
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()

    def _recent(self, source: str, now: float) -> deque[float] | None:
        times = self._failures.get(source)
        if times is None:
            return None
        while times and times[0] <= now - self.window_s:
            times.popleft()
        if not times:
            del self._failures[source]
            return None
        return times

    def blocked_for(self, source: str) -> float:
        """Seconds until ``source`` may try again; 0.0 when it is not blocked."""
        if self.limit <= 0:
            return 0.0
        now = self._clock()
        times = self._recent(source, now)
        if times is None or len(times) < self.limit:
            return 0.0
        # Blocked until enough failures age out to fall below the limit.
        return max(0.0, times[len(times) - self.limit] + self.window_s - now)

    def blocked(self, source: str) -> bool:
        return self.blocked_for(source) > 0.0

    def failed(self, source: str) -> None:
        """Count one failure of ``source``."""
        if self.limit <= 0:
            return
        now = self._clock()
        times = self._recent(source, now)
        if times is None:
            times = deque(maxlen=self.limit)
            self._failures[source] = times
        times.append(now)
        self._failures.move_to_end(source)
        while len(self._failures) > self.max_tracked:
            self._failures.popitem(last=False)

    def __len__(self) -> int:
        return len(self._failures)
