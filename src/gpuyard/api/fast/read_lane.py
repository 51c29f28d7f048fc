"""A few dedicated threads for the database reads of hot async paths.

The event loop never waits on a query (DESIGN.md rule 10): an ``async`` handler hands
its blocking read to :class:`ReadLane` and awaits the answer, so one slow query stalls
only the request that made it. The lane is leaner than a general thread pool — a job is
one tuple on a C ``SimpleQueue`` and its answer one ``call_soon_threadsafe`` onto an
asyncio future, with no ``concurrent.futures.Future`` in between — because the polled
``GET /v1/clusters/{id}`` pays the hand-off on every request: Starlette's
``run_in_threadpool`` there cost about half the throughput of bench/bench_get_cluster.py,
this lane no measurable cost.

Its threads are its own, so reads that hang cannot use up the worker threads that
FastAPI's synchronous routes (``/healthz`` among them) run on, nor the other way round.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from queue import Empty, SimpleQueue
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

# At most this many reads run at once; each thread keeps its own SQLite connection
# (store/sqlite_reader.py). More than one, so that one hung query leaves the lane
# serving everyone else.
DEFAULT_THREADS = 4

_Job = tuple["_Inbox", "asyncio.Future[Any]", Callable[..., Any], tuple[Any, ...]]


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():  # the awaiting request was cancelled meanwhile
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class _Inbox:
    """Answers on their way back to one event loop. Under load many reads finish while
    the loop is busy; they share one wake-up (``call_soon_threadsafe`` writes to the
    loop's self-pipe, a system call each), so the hand-back costs less per request the
    busier the server is."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._lock = threading.Lock()
        self._items: list[tuple[asyncio.Future[Any], Any, BaseException | None]] = []
        self._scheduled = False

    def put(self, future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
        with self._lock:
            self._items.append((future, result, error))
            if self._scheduled:
                return
            self._scheduled = True
        try:
            self.loop.call_soon_threadsafe(self._drain)
        except RuntimeError:
            log.debug("read lane: the loop closed before a read finished")

    def _drain(self) -> None:
        with self._lock:
            items, self._items = self._items, []
            self._scheduled = False
        for future, result, error in items:
            _settle(future, result, error)


class ReadLane:
    """Runs blocking calls on its own daemon threads for async callers.

    ``run`` is safe to call from any event loop. Jobs start in submission order, up to
    ``threads`` at a time. One thread serves while reads are quick: more threads running
    Python at once only fight over the GIL (measured: four busy lane threads cut the
    polled GET's throughput by a third). Another thread is started only when every live
    one has been on its current job for ``stall_s`` while jobs wait: a slow or hung
    query then stalls only its own request. Threads end after ``idle_s`` without work,
    so an idle server holds none. A call's exception is raised to its awaiter. Threads
    are daemons: a read still hanging at exit does not hold the process up.
    """

    def __init__(
        self,
        threads: int = DEFAULT_THREADS,
        idle_s: float = 30.0,
        name: str = "gpuyard-read",
        stall_s: float = 0.05,
    ) -> None:
        if threads < 1:
            raise ValueError("a read lane needs at least one thread")
        self._size = threads
        self._idle_s = idle_s
        self._stall_s = stall_s
        self._name = name
        self._jobs: SimpleQueue[_Job] = SimpleQueue()
        # Guarded by _lock: live threads, how many of them wait for a job, jobs queued
        # but not yet taken, and since when each busy thread has been on its job. A
        # thread counts a job it takes in the same step as its own leaving the idle
        # ones, so the two always match.
        self._lock = threading.Lock()
        self._threads = 0
        self._idle = 0
        self._pending = 0
        self._serial = 0
        self._busy_since: dict[int, float] = {}
        self._recheck_scheduled = False
        self._inboxes: dict[asyncio.AbstractEventLoop, _Inbox] = {}

    @property
    def threads(self) -> int:
        """How many lane threads are alive now."""
        with self._lock:
            return self._threads

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on a lane thread; its result, or its exception raised here."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        with self._lock:
            inbox = self._inboxes.get(loop)
            if inbox is None:
                # Loops of ended servers (tests) are dropped rather than kept forever.
                self._inboxes = {k: v for k, v in self._inboxes.items() if not k.is_closed()}
                inbox = self._inboxes[loop] = _Inbox(loop)
            self._jobs.put((inbox, future, fn, args))
            self._pending += 1
        self._grow(loop)
        return await future

    def _grow(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start a thread if jobs wait and every live thread is stalled (or there is
        none); while jobs wait behind busy threads, look again after ``stall_s``."""
        now = time.monotonic()
        spawn = recheck = False
        with self._lock:
            waiting = self._pending > self._idle and self._threads < self._size
            # Every live thread is on a job, and has been for stall_s.
            stalled = len(self._busy_since) == self._threads and all(
                now - t >= self._stall_s for t in self._busy_since.values()
            )
            if waiting and (self._threads == 0 or stalled):
                self._threads += 1
                self._idle += 1
                self._serial += 1
                spawn = True
            if waiting and not self._recheck_scheduled:
                self._recheck_scheduled = recheck = True
        if spawn:
            name = f"{self._name}-{self._serial}"
            threading.Thread(target=self._work, name=name, daemon=True).start()
        if recheck:
            loop.call_later(self._stall_s, self._recheck, loop)

    def _recheck(self, loop: asyncio.AbstractEventLoop) -> None:
        with self._lock:
            self._recheck_scheduled = False
        self._grow(loop)

    def _work(self) -> None:
        jobs, lock = self._jobs, self._lock
        me = threading.get_ident()
        while True:
            try:
                inbox, future, fn, args = jobs.get(timeout=self._idle_s)
            except Empty:
                with lock:
                    if self._pending == 0:
                        self._idle -= 1
                        self._threads -= 1
                        return
                continue
            with lock:
                self._idle -= 1
                self._pending -= 1
                self._busy_since[me] = time.monotonic()
            try:
                result, error = fn(*args), None
            except BaseException as exc:  # handed to the awaiter, which decides
                result, error = None, exc
            inbox.put(future, result, error)
            with lock:
                self._idle += 1
                del self._busy_since[me]
