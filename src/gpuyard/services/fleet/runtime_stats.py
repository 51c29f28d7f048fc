"""A short shared cache of runtime stats (or any slow per-key read): one fetch per key
per few seconds, however many requests ask, and concurrent misses of one key share
one in-flight fetch (single-flight).

Contract of :class:`SharedTtlCache`:
- :meth:`~SharedTtlCache.get_many` never fetches on the caller's thread: each miss is
  submitted to the cache's own thread pool, and the caller gets futures (so a list's
  keys are fetched concurrently, and an ``async`` caller awaits them with
  ``asyncio.wrap_future`` without blocking its loop);
- a key being fetched is answered by the same future, whoever asks (one call);
- a value is served for ``ttl_s`` after its fetch completed; a fetch that raised is
  served (re-raised) for only ``error_ttl_s`` (short: a failing engine is not hammered
  by every poll, and a recovered one is seen soon);
- expired entries are dropped now and then, so keys that are never asked again (a
  terminated cluster's) do not accumulate.

Thread-safe; one instance is shared by every request of an app.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Generic, TypeVar

from gpuyard.runtimes.base import ContainerStats

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

DEFAULT_TTL_S = 3.0
DEFAULT_ERROR_TTL_S = 0.5
# Engine calls of one list in flight at once (a list of 200 running clusters on a
# slow engine costs about 200 / this round trips).
DEFAULT_WORKERS = 16


@dataclass(frozen=True)
class StatsKey:
    """One container's stats: a cluster's, read from the engine of its host (a cluster
    placed on another host is another key)."""

    cluster_id: str
    host_id: int | None


@dataclass
class _Entry(Generic[V]):
    future: Future[V]
    # Monotonic time after which the entry is stale; None while the fetch runs.
    expires_at: float | None = None


class SharedTtlCache(Generic[K, V]):
    """See the module docstring. ``clock`` (monotonic seconds) and ``pool`` are
    injectable; by default the cache owns a pool of ``DEFAULT_WORKERS`` threads."""

    def __init__(
        self,
        *,
        ttl_s: float = DEFAULT_TTL_S,
        error_ttl_s: float = DEFAULT_ERROR_TTL_S,
        clock: Callable[[], float] = time.monotonic,
        pool: Executor | None = None,
        thread_name_prefix: str = "shared-cache",
    ) -> None:
        if ttl_s < 0 or error_ttl_s < 0:
            raise ValueError("ttl_s and error_ttl_s must not be negative")
        self.ttl_s = ttl_s
        self.error_ttl_s = min(error_ttl_s, ttl_s)
        self._clock = clock
        self._pool = pool or ThreadPoolExecutor(
            max_workers=DEFAULT_WORKERS, thread_name_prefix=thread_name_prefix
        )
        self._lock = threading.Lock()
        self._entries: dict[K, _Entry[V]] = {}
        self._next_prune = 0.0

    def get_many(self, keys: Sequence[K], fetch: Callable[[K], V]) -> list[Future[V]]:
        """A future of each key's value, in order: a fresh cached one, the one in
        flight, or a new fetch ``fetch(key)`` started on the pool."""
        now = self._clock()
        out: list[Future[V]] = []
        started: list[tuple[K, _Entry[V]]] = []
        with self._lock:
            if now >= self._next_prune:
                self._prune(now)
            for key in keys:
                entry = self._entries.get(key)
                if entry is None or (entry.expires_at is not None and now >= entry.expires_at):
                    entry = _Entry(Future())
                    self._entries[key] = entry
                    started.append((key, entry))
                out.append(entry.future)
        # Submitted outside the lock: a pool that runs the fetch inline (tests) must
        # be able to call back into the cache.
        for key, entry in started:
            try:
                self._pool.submit(self._fetch, key, entry, fetch)
            except RuntimeError as exc:  # the pool is shut down (the app is closing)
                with self._lock:
                    self._entries.pop(key, None)
                entry.future.set_exception(exc)
        return out

    def get(self, key: K, fetch: Callable[[K], V]) -> V:
        """One key's value, waiting for it (a synchronous caller's path). Re-raises
        what the fetch raised."""
        return self.get_many([key], fetch)[0].result()

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def _fetch(self, key: K, entry: _Entry[V], fetch: Callable[[K], V]) -> None:
        try:
            value = fetch(key)
        except BaseException as exc:  # handed to every waiter, cached briefly
            self._settle(entry, self.error_ttl_s)
            entry.future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        self._settle(entry, self.ttl_s)
        entry.future.set_result(value)

    def _settle(self, entry: _Entry[V], ttl: float) -> None:
        # The expiry counts from the answer, not the ask: a slow engine's stats are
        # still served for the whole ttl.
        with self._lock:
            entry.expires_at = self._clock() + ttl

    def _prune(self, now: float) -> None:
        """Drop expired entries (called under the lock, at most every 10 ttls)."""
        stale = [
            k for k, e in self._entries.items() if e.expires_at is not None and now >= e.expires_at
        ]
        for k in stale:
            del self._entries[k]
        self._next_prune = now + max(10 * self.ttl_s, 1.0)


# What GraphQL's runtime fields share: each container's stats, or None when the
# container is not running.
RuntimeStatsCache = SharedTtlCache[StatsKey, ContainerStats | None]
