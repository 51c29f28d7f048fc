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
from collections.abc import Callable
from queue import Empty, SimpleQueue
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

# At most this many reads run at once; each thread keeps its own SQLite connection
# (store/sqlite_reader.py). More than one, so that one hung query leaves the lane
# serving everyone else.
DEFAULT_THREADS = 4

_Job = tuple[asyncio.AbstractEventLoop, "asyncio.Future[Any]", Callable[..., Any], tuple[Any, ...]]


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():  # the awaiting request was cancelled meanwhile
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class ReadLane:
    """Runs blocking calls on its own daemon threads for async callers.

    ``run`` is safe to call from any event loop. Jobs start in submission order, up to
    ``threads`` at a time; a thread is started only when more jobs wait than threads
    are idle, and ends after ``idle_s`` without work, so an idle server holds none. A
    call's exception is raised to its awaiter. Threads are daemons: a read still
    hanging at exit does not hold the process up.
    """

    def __init__(
        self, threads: int = DEFAULT_THREADS, idle_s: float = 30.0, name: str = "gpuyard-read"
    ) -> None:
        if threads < 1:
            raise ValueError("a read lane needs at least one thread")
        self._size = threads
        self._idle_s = idle_s
        self._name = name
        self._jobs: SimpleQueue[_Job] = SimpleQueue()
        # Guarded by _lock: live threads, how many of them wait for a job, and jobs
        # queued but not yet taken. A thread counts a job it takes in the same step
        # as its own leaving the idle ones, so the two always match.
        self._lock = threading.Lock()
        self._threads = 0
        self._idle = 0
        self._pending = 0
        self._serial = 0

    @property
    def threads(self) -> int:
        """How many lane threads are alive now."""
        with self._lock:
            return self._threads

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on a lane thread; its result, or its exception raised here."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        spawn = False
        with self._lock:
            self._jobs.put((loop, future, fn, args))
            self._pending += 1
            if self._pending > self._idle and self._threads < self._size:
                self._threads += 1
                self._idle += 1
                self._serial += 1
                spawn = True
        if spawn:
            name = f"{self._name}-{self._serial}"
            threading.Thread(target=self._work, name=name, daemon=True).start()
        return await future

    def _work(self) -> None:
        jobs, lock = self._jobs, self._lock
        while True:
            try:
                loop, future, fn, args = jobs.get(timeout=self._idle_s)
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
            try:
                result, error = fn(*args), None
            except BaseException as exc:  # handed to the awaiter, which decides
                result, error = None, exc
            try:
                loop.call_soon_threadsafe(_settle, future, result, error)
            except RuntimeError:
                log.debug("read lane: the loop closed before a read finished")
            with lock:
                self._idle += 1
