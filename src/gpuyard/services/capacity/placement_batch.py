"""Placement in batches: concurrent creates share one locked transaction and one commit.

A create hands its whole recording step (a function of the session: rows, claim,
ports, admission, events) to its process's :class:`Placer` and waits. The first
waiter to find no batch running becomes the leader: it takes every queued step (up to
``MAX_BATCH``), opens one write transaction, takes the placement lock once, runs each
step in a SAVEPOINT of its own, commits once, and only then wakes each waiter with its
own answer (the value its step returned, or the error it raised). Then it hands the
lead to the oldest request that queued meanwhile, which runs the next batch (after up
to ``GATHER_S`` for as many requests as the last batch held; never after a batch of
one). A hint rebuild that only its age calls for is read before the batch's locked
transaction (fleet_hint.FleetHint.rebuild_if_aged).

Guarantees, the same as one transaction per create:

- every step runs under the placement lock (lock_placement, taken before the first
  SAVEPOINT, so a rolled-back step never releases it), so no GPU or port is handed
  twice, within a batch (each step sees the rows the steps before it flushed) or
  across processes and replicas (the lock row serialises their batches);
- a step's refusal (InsufficientCapacity, a quota or budget, a reused idempotency key,
  any exception) rolls back its own SAVEPOINT only: the others commit;
- a failure of the batch itself (the lock, a SAVEPOINT that cannot roll back, the
  commit) rolls the whole transaction back: nothing of any step is stored, and every
  waiter whose step had succeeded is answered with that failure;
- no waiter is answered before the commit that holds its rows;
- a batch of one runs without a SAVEPOINT: the single create pays nothing extra.

Batch writers. A request may also bring a *fast form* (:class:`BatchWriter` and an
item for it): the requests of one writer in a batch are then decided together, in
memory, and written with one multi-row statement per table (the cluster creates of
services/clusters/create_batch.py), first in the transaction. The writer answers each
item with its value, or :data:`DECLINED` when it cannot decide that item exactly as
the step would (a refusal, a rare option): declined requests then run their own steps
one by one, each in its SAVEPOINT, after the writer's rows, under the same lock. So a
refusal is always answered by the step itself, with its own error, and the writer
never has to say why. A writer that raises rolls the transaction back (nothing is
stored yet) and the batch runs again, in a new one, every request by its own step.

Each step runs in the leader's thread inside a copy of its own request's
``contextvars`` (request ids, audit); a writer runs in the leader's own (what it
records reads none of them). One placer per process and session factory
(:func:`placer_for`); with several replicas the placement lock still orders batches.
"""

from __future__ import annotations

import contextvars
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final, Generic, Protocol, TypeVar

from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from gpuyard.services.capacity.fleet_hint import FleetHint, hint_for, hint_of
from gpuyard.services.capacity.placement import BATCH_TOUCHED, lock_placement
from gpuyard.services.clusters.lifecycle import PRICES_KEY
from gpuyard.services.context import Context

T = TypeVar("T")


class _Declined:
    def __repr__(self) -> str:
        return "DECLINED"


# A batch writer's answer for an item it leaves to the item's own step.
DECLINED: Final = _Declined()


class BatchWriter(Protocol):
    """Records several requests' steps at once (see the module docstring)."""

    def write(self, session: Session, items: list[Any]) -> list[Any]:
        """One answer per item, in order: the value its step would return, or
        DECLINED. Runs first in the batch's transaction, under the placement lock;
        must leave nothing of a declined item. Raising rolls the transaction back: the
        batch runs again, each item by its own step."""
        ...


# The most steps one transaction takes: bounds a batch's lock hold and its waiters'
# latency while requests keep arriving.
MAX_BATCH = 64
# The longest a leader waits for the queue to hold as many requests as its last batch.
GATHER_S = 0.002


@dataclass(eq=False)
class _Request(Generic[T]):
    ctx: Context
    step: Callable[[Session], T]
    context: contextvars.Context
    writer: BatchWriter | None = None
    item: Any = None
    done: threading.Event = field(default_factory=threading.Event)
    lead: bool = False
    answered: bool = False
    value: Any = None
    error: BaseException | None = None

    def answer(self) -> T:
        if self.error is not None:
            raise self.error
        return self.value  # type: ignore[no-any-return]


class Placer:
    """See the module docstring. Thread-safe."""

    def __init__(self, max_batch: int = MAX_BATCH) -> None:
        self.max_batch = max_batch
        self._mutex = threading.Lock()
        # Notified whenever a request joins the queue (wait_queued).
        self._joined = threading.Condition(self._mutex)
        self._queue: list[_Request[Any]] = []
        self._leading = False
        self._last_size = 1
        # Figures for benchmarks and tests: batches committed (or failed), requests
        # run, and of those, answered by a batch writer (committed).
        self.batches = 0
        self.steps = 0
        self.written = 0

    def run(
        self,
        ctx: Context,
        step: Callable[[Session], T],
        fast: tuple[BatchWriter, Any] | None = None,
    ) -> T:
        """Run ``step`` inside a write transaction under the placement lock, together
        with whatever other steps are waiting, and return what it returned once that
        transaction has committed (or raise what it raised; nothing of it is stored
        then). ``step`` must not commit, nor call :meth:`run` itself. ``fast``: a
        writer and its item, recording the same as ``step`` when the writer takes it
        (see the module docstring)."""
        if getattr(_LEADING, "active", False):
            # Its batch would wait for the very transaction this thread holds.
            raise RuntimeError("a placer step may not queue another step")
        request: _Request[T] = _Request(ctx, step, contextvars.copy_context())
        if fast is not None:
            request.writer, request.item = fast
        with self._mutex:
            self._queue.append(request)
            self._joined.notify_all()
            lead = not self._leading
            self._leading = True
        if not lead:
            request.done.wait()
        if not request.answered:
            self._lead()
        return request.answer()

    def wait_queued(self, count: int, timeout: float) -> bool:
        """Wait until ``count`` requests wait for a batch (not counting one running);
        False if ``timeout`` seconds passed first. For tests and benchmarks."""
        with self._joined:
            return self._joined.wait_for(lambda: len(self._queue) >= count, timeout)

    def _lead(self) -> None:
        """Run one batch of the queue, then pass the lead on (or give it up)."""
        # Let the threads the last batch just answered run first: those that create
        # again then join this batch instead of forming the next one on their own.
        time.sleep(0)
        with self._joined:
            # As many as the last batch held, or GATHER_S at most: under load the
            # batch's fixed costs (lock, hint, reads, commit) are shared by more
            # creates; a lone request (the last batch one) never waits.
            want = min(self._last_size, self.max_batch)
            if want > 1 and len(self._queue) < want:
                self._joined.wait_for(lambda: len(self._queue) >= want, GATHER_S)
            batch, self._queue = self._queue[: self.max_batch], self._queue[self.max_batch :]
            self._last_size = len(batch)
        _LEADING.active = True
        try:
            self._run_batch(batch)
        except BaseException as exc:
            # _run_batch answers every request itself; should it raise all the same,
            # nothing of the batch committed: no waiter may take an unset value for
            # its answer.
            for request in batch:
                if request.error is None:
                    request.value, request.error = None, exc
            raise
        finally:
            _LEADING.active = False
            for request in batch:
                request.answered = True
                request.done.set()
            with self._mutex:
                if self._queue:
                    nxt = self._queue[0]
                    nxt.lead = True
                    nxt.done.set()
                else:
                    self._leading = False

    def _run_batch(self, batch: list[_Request[Any]], writers: bool = True) -> None:
        ctx = batch[0].ctx
        ok: list[_Request[Any]] = []
        hint: FleetHint | None = None
        try:
            # Inside the try: a database lost here (a failover) is every request's
            # answer, as one lost in the transaction is.
            _rebuild_aged_hint(ctx)
            with ctx.transaction() as session:
                lock_placement(session)
                hint = hint_for(session)
                ok = _run_writers(session, batch) if writers else []
                by_writer = len(ok)
                rest = [r for r in batch if r not in ok]
                if len(rest) == 1 and not ok:
                    only = rest[0]
                    try:
                        only.value = only.context.run(only.step, session)
                    except BaseException as exc:
                        only.error = exc
                        raise
                    ok.append(only)
                else:
                    for request in rest:
                        if _run_in_savepoint(session, request):
                            ok.append(request)
            self.batches += 1
            self.steps += len(batch)
            self.written += by_writer
        except _WriterFailed as failed:
            # Nothing of the batch was stored: it runs again, every request by its
            # own step. The hosts the writer claimed on are read again.
            if hint is not None:
                hint.dirty.update(failed.touched)
            for request in batch:
                request.value = None
            self._run_batch(batch, writers=False)
        except BaseException as exc:
            self.batches += 1
            if hint is not None and (len(batch) > 1 or any(r.writer for r in ok)):
                # What the batch's claims told the hint never happened (a lone step's
                # claim tells the hint of a rollback itself).
                hint.invalidate()
            for request in ok:
                request.value, request.error = None, exc
            for request in batch:
                if request.error is None and request not in ok:
                    request.error = exc


def _rebuild_aged_hint(ctx: Context) -> None:
    """The hint's rebuild by age (every fleet_hint.MAX_AGE: every host and GPU claim
    read, 100-500 ms for 10,000 hosts) in a read of its own, before the batch's locked
    transaction, so no other batch waits for it; the locked refresh still rebuilds when
    the fingerprint moved."""
    engine = ctx.sessions.kw.get("bind")
    if not isinstance(engine, Engine):
        return
    hint, ratios, now = hint_of(engine), ctx.settings.allocation_ratios, ctx.clock.now()
    if hint.aged(ratios, now):
        with ctx.read() as session:
            hint.rebuild_if_aged(session, ratios, now)


class _WriterFailed(Exception):
    """A batch writer raised: its batch runs again without writers."""

    def __init__(self, touched: set[int]) -> None:
        super().__init__("a batch writer failed")
        self.touched = touched


def _run_writers(session: Session, batch: list[_Request[Any]]) -> list[_Request[Any]]:
    """Let each batch writer record its requests of ``batch``, first in the batch's
    transaction (no SAVEPOINT: a writer that raises fails the transaction with
    _WriterFailed, and the batch runs again without writers); returns the requests
    answered so (their value set), in batch order."""
    groups: dict[int, tuple[BatchWriter, list[_Request[Any]]]] = {}
    for request in batch:
        if request.writer is not None:
            groups.setdefault(id(request.writer), (request.writer, []))[1].append(request)
    done: set[int] = set()
    for writer, requests in groups.values():
        touched: set[int] = set()
        session.info[BATCH_TOUCHED] = touched
        try:
            answers = writer.write(session, [r.item for r in requests])
            if len(answers) != len(requests):
                raise RuntimeError("a batch writer must answer every item")
        except Exception as exc:
            raise _WriterFailed(touched) from exc
        finally:
            session.info.pop(BATCH_TOUCHED, None)
        for request, answer in zip(requests, answers, strict=True):
            if answer is not DECLINED:
                request.value = answer
                done.add(id(request))
    return [r for r in batch if id(r) in done]


def _run_in_savepoint(session: Session, request: _Request[Any]) -> bool:
    """Run one step in a SAVEPOINT; True when it succeeded. A step that raises is
    rolled back to its SAVEPOINT (hosts its claims touched are re-read by the hint)
    and keeps its error; a SAVEPOINT that cannot be rolled back fails the batch."""
    touched: set[int] = set()
    session.info[BATCH_TOUCHED] = touched
    try:
        # Committed (released) on success, rolled back on any exception, whatever
        # state a failed flush left it in.
        with session.begin_nested():
            # Its own context's prices meter it (contexts may share one database).
            session.info[PRICES_KEY] = request.ctx.settings.prices
            request.value = request.context.run(request.step, session)
    except Exception as exc:
        request.value, request.error = None, exc
        hint_for(session).dirty.update(touched)
        return False
    finally:
        session.info.pop(BATCH_TOUCHED, None)
    return True


# Set in the thread that runs a batch, while it runs.
_LEADING = threading.local()

_PLACERS: weakref.WeakKeyDictionary[sessionmaker[Session], Placer] = weakref.WeakKeyDictionary()
_PLACERS_LOCK = threading.Lock()


def placer_for(ctx: Context) -> Placer:
    """This process's placer for ``ctx``'s database (one per session factory)."""
    with _PLACERS_LOCK:
        placer = _PLACERS.get(ctx.sessions)
        if placer is None:
            placer = _PLACERS[ctx.sessions] = Placer()
        return placer
