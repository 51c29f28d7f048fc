"""One keyed work queue with lanes, serving clusters and training clusters alike
(DESIGN.md rules 9 and 10).

- **Keys.** At most one job per key runs at a time (a cluster's start, stop and
  collection never interleave). A key submitted while its job runs is remembered and
  run once more afterwards (the job sees the newest state), never twice at once.
- **Lanes.** Each lane has its own worker threads. Slow work (image pulls, readiness
  waits, drains, training operations) goes to ``slow``; stops, terminates,
  auto-terminations and collection go to ``urgent``, so they are never queued behind a
  hanging pull or drain of another key.
- **Back-off.** A job that raises is retried for the same key only after an
  exponential delay (``base_s`` doubling to ``max_s``), like a Kubernetes rate-limited
  work queue; a job that succeeds clears its key's failures. Submissions during the
  back-off are held and run when it ends.

The clock is injected (monotonic seconds), so tests drive back-off without sleeping.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from gpuyard.store.outage import is_database_unavailable

log = logging.getLogger(__name__)

Job = Callable[[], None]


@dataclass(frozen=True)
class Backoff:
    base_s: float = 0.5
    max_s: float = 60.0

    def delay(self, failures: int) -> float:
        if failures <= 0:
            return 0.0
        return min(self.base_s * 2.0 ** min(failures - 1, 64), self.max_s)


@dataclass
class _Key:
    lane: str
    job: Job
    running: bool = False
    again: bool = False
    failures: int = 0
    not_before: float = 0.0
    timer: threading.Timer | None = field(default=None, repr=False)


class WorkQueue:
    """Keyed jobs on lanes of worker threads. Thread-safe."""

    def __init__(
        self,
        lanes: dict[str, int],
        *,
        backoff: Backoff | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_done: Callable[[], None] | None = None,
    ) -> None:
        self._pools = {
            lane: ThreadPoolExecutor(max_workers=n, thread_name_prefix=f"work-{lane}")
            for lane, n in lanes.items()
        }
        self.backoff = backoff or Backoff()
        self.clock = clock
        # Called after every job (e.g. to wake the reconciler: the world moved).
        self.on_done = on_done
        self._lock = threading.Lock()
        self._keys: dict[Hashable, _Key] = {}
        self._closed = False

    def ensure_lane(self, lane: str, workers: int) -> None:
        """Add lane ``lane`` with ``workers`` threads unless it exists (per-host lanes
        are made when a host is first worked on; threads start only when used)."""
        with self._lock:
            if lane not in self._pools and not self._closed:
                self._pools[lane] = ThreadPoolExecutor(
                    max_workers=workers, thread_name_prefix=f"work-{lane}"
                )

    def submit(self, key: Hashable, lane: str, job: Job) -> bool:
        """Run ``job`` for ``key`` on ``lane``. If the key's job is running, run this
        one after it; if the key is backing off, when the back-off ends. Returns False
        only when the queue is closed (then a lane made on first use may not exist:
        closing is not an error)."""
        with self._lock:
            if self._closed:
                return False
            if lane not in self._pools:
                raise ValueError(f"unknown lane {lane!r}")
            entry = self._keys.get(key)
            if entry is None:
                entry = self._keys[key] = _Key(lane, job)
            else:
                entry.lane, entry.job = lane, job
            if entry.running:
                entry.again = True
                return True
            wait = entry.not_before - self.clock()
            if wait > 0:
                entry.again = True
                return True
            # This run covers every earlier submission and any pending retry.
            entry.running, entry.again = True, False
            timer, entry.timer = entry.timer, None
        if timer is not None:
            timer.cancel()
        self._dispatch(key, entry)
        return True

    def _dispatch(self, key: Hashable, entry: _Key) -> None:
        try:
            self._pools[entry.lane].submit(self._run, key, entry)
        except RuntimeError:  # shut down
            with self._lock:
                entry.running = False

    def _run(self, key: Hashable, entry: _Key) -> None:
        ok = True
        try:
            entry.job()
        except Exception as exc:
            ok = False
            if is_database_unavailable(exc):
                # A failover or restart: every job fails alike for a few seconds, and
                # its back-off retries it; one line each, not a stack trace.
                log.warning("work for %s waits for the database: %s", key, exc.__class__.__name__)
            else:
                log.exception("work for %s failed", key)
        rerun_in: float | None = None
        with self._lock:
            entry.running = False
            if ok:
                entry.failures = 0
                entry.not_before = 0.0
            else:
                entry.failures += 1
                entry.not_before = self.clock() + self.backoff.delay(entry.failures)
                entry.again = True  # a failed job is retried after its back-off
            if entry.again and not self._closed:
                entry.again = False
                wait = entry.not_before - self.clock()
                if wait <= 0:
                    entry.running = True
                    rerun_in = 0.0
                else:
                    rerun_in = wait
            elif entry.failures == 0 and not entry.again:
                self._keys.pop(key, None)
        if rerun_in == 0.0:
            self._dispatch(key, entry)
        elif rerun_in is not None:
            self._later(key, entry, rerun_in)
        hook = self.on_done
        if hook is not None:
            try:
                hook()
            except Exception:
                log.exception("work queue hook failed")

    def _later(self, key: Hashable, entry: _Key, delay: float) -> None:
        def fire() -> None:
            self.submit(key, entry.lane, entry.job)

        timer = threading.Timer(delay, fire)
        timer.daemon = True
        with self._lock:
            if entry.timer is not None:
                entry.timer.cancel()
            entry.timer = timer
        timer.start()

    def failures(self, key: Hashable) -> int:
        """How often ``key``'s job has failed in a row (0 when it last succeeded)."""
        with self._lock:
            entry = self._keys.get(key)
            return entry.failures if entry else 0

    def busy(self, key: Hashable | None = None) -> bool:
        """Whether ``key``'s job (or, without a key, any job) is running or queued."""
        with self._lock:
            if key is not None:
                entry = self._keys.get(key)
                return entry is not None and entry.running
            return any(e.running for e in self._keys.values())

    def close(self, wait: bool = True) -> None:
        """Stop taking work; cancel back-off timers; wait for running jobs if asked."""
        with self._lock:
            self._closed = True
            timers = [e.timer for e in self._keys.values() if e.timer is not None]
        for t in timers:
            t.cancel()
        with self._lock:
            pools = list(self._pools.values())
        for pool in pools:
            pool.shutdown(wait=wait, cancel_futures=True)
