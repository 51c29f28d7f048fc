"""Token buckets by identity, in bounded memory: the arithmetic of the API's rate limits.

A bucket holds up to ``burst`` tokens and gains ``per_second`` tokens each second; a
request takes one. Time is a number of seconds passed in by the caller (a monotonic
clock in production, a fake one in tests): nothing here reads a clock or sleeps.

A :class:`BucketTable` keeps one bucket per identity (a key's hash, an address) in
least-recently-used order, so every operation is O(1):

- a bucket that has been idle long enough to be full again holds nothing a fresh bucket
  would not, so it is dropped (up to two of the oldest on each call);
- past ``max_entries`` the oldest bucket is dropped even if not full: a flood of new
  identities (random keys, many addresses) cannot grow memory without bound. The cost is
  that a dropped identity starts again with a full bucket.

Not thread-safe: the API uses a table from its event loop only.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from typing import NamedTuple

# How many idle buckets one call may drop: enough to keep up with any insertion rate.
_SWEEP = 2


@dataclass(frozen=True, slots=True)
class Rate:
    """``per_second`` tokens a second, at most ``burst`` at once (both > 0)."""

    per_second: float
    burst: int

    def __post_init__(self) -> None:
        if not (self.per_second > 0 and math.isfinite(self.per_second)):
            raise ValueError(f"per_second must be a positive number, not {self.per_second}")
        if self.burst < 1:
            raise ValueError(f"burst must be at least 1, not {self.burst}")

    @property
    def refill_s(self) -> float:
        """Seconds an empty bucket takes to fill up."""
        return self.burst / self.per_second


class Decision(NamedTuple):
    """One bucket's answer: whether the request may go, and the tokens left after it
    (a tuple: cheap to make on every request; the figures below are worked out only
    for the answer that is shown)."""

    allowed: bool
    tokens: float
    rate: Rate

    @property
    def limit(self) -> int:
        return self.rate.burst

    @property
    def remaining(self) -> int:
        """Whole tokens left after this request."""
        return int(self.tokens) if self.tokens > 0 else 0

    @property
    def reset_s(self) -> float:
        """Seconds until the bucket is full again."""
        return max(self.rate.burst - self.tokens, 0.0) / self.rate.per_second

    @property
    def retry_after_s(self) -> float:
        """Seconds until the next request would be allowed (0: now)."""
        return max(1.0 - self.tokens, 0.0) / self.rate.per_second


class _Bucket:
    __slots__ = ("stamp", "tokens")

    def __init__(self, tokens: float, stamp: float) -> None:
        self.tokens = tokens
        self.stamp = stamp


class BucketTable:
    """One token bucket per identity at one :class:`Rate`, at most ``max_entries``."""

    def __init__(self, rate: Rate, max_entries: int) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be at least 1, not {max_entries}")
        self.rate = rate
        self.max_entries = max_entries
        self._full = float(rate.burst)
        self._buckets: OrderedDict[Hashable, _Bucket] = OrderedDict()

    def __len__(self) -> int:
        return len(self._buckets)

    def take(self, ident: Hashable, now: float) -> Decision:
        """Take one token from ``ident``'s bucket if it has one. A refused request
        takes nothing."""
        bucket = self._current(ident, now)
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return Decision(True, bucket.tokens, self.rate)
        return Decision(False, bucket.tokens, self.rate)

    def charge(self, ident: Hashable, now: float) -> Decision:
        """Take one token whether or not there is one: the bucket may go into debt, down
        to ``-burst``, so that work already done (a failed login that got through while
        others were in flight) is still paid for before the next is allowed."""
        bucket = self._current(ident, now)
        bucket.tokens = max(bucket.tokens - 1.0, -float(self.rate.burst))
        return Decision(bucket.tokens >= 1.0, bucket.tokens, self.rate)

    def peek(self, ident: Hashable, now: float) -> Decision:
        """Whether ``ident`` has a token, taking none. An unknown identity is not added."""
        bucket = self._buckets.get(ident)
        tokens = float(self.rate.burst) if bucket is None else self._refilled(bucket, now)
        return Decision(tokens >= 1.0, tokens, self.rate)

    def _refilled(self, bucket: _Bucket, now: float) -> float:
        # A clock that went backwards adds nothing (and takes nothing away).
        if now <= bucket.stamp:
            return bucket.tokens
        tokens = bucket.tokens + (now - bucket.stamp) * self.rate.per_second
        return tokens if tokens < self._full else self._full

    def _current(self, ident: Hashable, now: float) -> _Bucket:
        """``ident``'s bucket, refilled to ``now`` and marked most recently used."""
        buckets = self._buckets
        bucket = buckets.get(ident)
        if bucket is None:
            self._sweep(now)
            if len(buckets) >= self.max_entries:
                buckets.popitem(last=False)
            bucket = buckets[ident] = _Bucket(self._full, now)
            return bucket
        if now > bucket.stamp:
            bucket.tokens = self._refilled(bucket, now)
            bucket.stamp = now
        buckets.move_to_end(ident)
        return bucket

    def _sweep(self, now: float) -> None:
        """Drop up to ``_SWEEP`` of the least recently used buckets that are full again."""
        buckets = self._buckets
        for _ in range(_SWEEP):
            if not buckets:
                return
            oldest = next(iter(buckets.values()))
            if self._refilled(oldest, now) < self._full:
                return
            buckets.popitem(last=False)
