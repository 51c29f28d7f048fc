"""Placement in batches (services/capacity/placement_batch.py), on SQLite and
PostgreSQL: creates queued behind a running batch are recorded together in one
transaction, each in its own SAVEPOINT, and answered only after its commit.

Each test holds the placer's lead with a step that waits on an event, queues the
creates behind it (waiting on the placer's own queue, never on a clock), then lets
them run as one batch."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from gpuyard.core.errors import InsufficientCapacity, ValidationFailed
from gpuyard.core.models import ResourceRequest
from gpuyard.core.placement import AllocationRatios
from gpuyard.services.capacity import fleet_hint
from gpuyard.services.capacity.placement_batch import Placer, placer_for
from gpuyard.services.clusters.requests import CreateCluster
from gpuyard.services.clusters.use_cases import create_cluster
from gpuyard.services.context import Context
from gpuyard.services.fleet.hosts import capacities
from gpuyard.services.idempotency import ROUTE_CLUSTERS, claim_for, create_once
from gpuyard.services.tenancy.auth import Principal
from gpuyard.store.schema import Cluster, Event, GpuAllocation, IdempotencyKey, Reservation

A6000 = "NVIDIA RTX A6000"
WAIT_S = 60.0


def one_gpu(name: str, gpu: str = A6000, count: int = 1) -> CreateCluster:
    return CreateCluster(name=name, gpu_type=gpu, gpu_count=count, docker_image="img")


@contextmanager
def held_batch(ctx: Context, pool: ThreadPoolExecutor) -> Iterator[Placer]:
    """The placer of ``ctx``'s database, its lead held by a waiting step until the
    block ends; what is submitted meanwhile queues for the next batch."""
    placer = placer_for(ctx)
    release, holding = threading.Event(), threading.Event()

    def hold(_session: Session) -> None:
        holding.set()
        assert release.wait(WAIT_S)

    held = pool.submit(placer.run, ctx, hold)
    assert holding.wait(WAIT_S)
    try:
        yield placer
    finally:
        release.set()
        held.result(WAIT_S)


def queue(
    placer: Placer, pool: ThreadPoolExecutor, calls: list[Callable[[], Any]]
) -> list[Future[Any]]:
    """Submit each call in order, each queued before the next is submitted."""
    futures = []
    for index, call in enumerate(calls):
        futures.append(pool.submit(call))
        assert placer.wait_queued(index + 1, WAIT_S)
    return futures


def outcome(future: Future[Any]) -> Any:
    try:
        return future.result(WAIT_S)
    except Exception as exc:  # the answer under test: a value or its error
        return exc


def count(ctx: Context, column: Any) -> int:
    with ctx.read() as session:
        return int(session.scalar(select(func.count(column))) or 0)


def test_32_concurrent_creates_in_one_batch_never_hand_a_gpu_twice(
    ctx: Context, alice: Principal
) -> None:
    """The host has 4 A6000 and 4 4090: 32 creates in one batch place exactly 8, each
    refusal (InsufficientCapacity) its own, no GPU index twice, one commit."""

    def create(i: int) -> Callable[[], Cluster]:
        gpu = A6000 if i % 2 else "NVIDIA GeForce RTX 4090"
        return lambda: create_cluster(ctx, alice, one_gpu(f"c{i}", gpu))

    with ThreadPoolExecutor(max_workers=40) as pool:
        with held_batch(ctx, pool) as placer:
            batches = placer.batches
            futures = queue(placer, pool, [create(i) for i in range(32)])
        results = [outcome(f) for f in futures]
    assert placer.batches - batches == 2  # the held one, then all 32 together
    placed = [r for r in results if isinstance(r, Cluster)]
    refused = [r for r in results if isinstance(r, InsufficientCapacity)]
    assert len(placed) == 8 and len(refused) == 24
    with ctx.read() as session:
        rows = session.execute(select(GpuAllocation.host_id, GpuAllocation.gpu_index)).all()
        stored = set(session.scalars(select(Cluster.id)))
    assert len(rows) == 8 and len(set(rows)) == 8
    assert stored == {c.id for c in placed}
    # Every answer was given after its commit: each cluster reads back as answered.
    assert sorted(i for c in placed for i in c.gpu_indices) == sorted(i for _, i in rows)


def test_a_refusal_in_a_batch_refuses_only_its_own_create(ctx: Context, alice: Principal) -> None:
    """In one batch: a create too large for the host (refused after its cluster row was
    flushed), an unknown GPU type, two creates with one Idempotency-Key (one places,
    both answer its cluster) and two plain creates: only the refused ones are absent."""
    body = one_gpu("keyed")
    claim = claim_for(ctx, alice, ROUTE_CLUSTERS, "batch-key", body.model_dump())

    def keyed() -> tuple[str, bool]:
        return create_once(ctx, claim, lambda c: create_cluster(ctx, alice, body, idempotency=c).id)

    calls: list[Callable[[], Any]] = [
        lambda: create_cluster(ctx, alice, one_gpu("first")),
        lambda: create_cluster(ctx, alice, one_gpu("too-big", count=5)),
        keyed,
        lambda: create_cluster(ctx, alice, one_gpu("unknown", gpu="NVIDIA Imaginary")),
        keyed,
        lambda: create_cluster(ctx, alice, one_gpu("last")),
    ]
    with ThreadPoolExecutor(max_workers=8) as pool:
        with held_batch(ctx, pool) as placer:
            futures = queue(placer, pool, calls)
        first, too_big, key_a, unknown, key_b, last = (outcome(f) for f in futures)
    assert isinstance(too_big, InsufficientCapacity)
    assert isinstance(unknown, ValidationFailed)
    assert isinstance(first, Cluster) and isinstance(last, Cluster)
    assert key_a[0] == key_b[0] and sorted([key_a[1], key_b[1]]) == [False, True]
    with ctx.read() as session:
        names = set(session.scalars(select(Cluster.name)))
        held = set(session.scalars(select(GpuAllocation.cluster_id)))
        reserved = set(session.scalars(select(Reservation.cluster_id)))
        keys = list(session.scalars(select(IdempotencyKey.resource_id)))
        events = set(session.scalars(select(Event.cluster_id)))
    assert names == {"first", "keyed", "last"}
    ids = {first.id, last.id, key_a[0]}
    assert held == reserved == events == ids
    assert keys == [key_a[0]]


class Crash(BaseException):
    """A failure no SAVEPOINT catches (as an interpreter's own would be)."""


def test_a_crash_mid_batch_leaves_nothing_half_made_and_answers_every_waiter(
    ctx: Context, alice: Principal
) -> None:
    """A step of the batch fails beyond its SAVEPOINT after two creates of the batch
    succeeded: the whole transaction rolls back, every waiter is answered with that
    failure, nothing of any create is stored, and the next create places normally."""

    def crash(session: Session) -> None:
        session.add(Cluster(id="crashxxxxxxxxx"))
        raise Crash("mid-batch")

    calls: list[Callable[[], Any]] = [
        lambda: create_cluster(ctx, alice, one_gpu("a")),
        lambda: create_cluster(ctx, alice, one_gpu("b")),
        lambda: placer_for(ctx).run(ctx, crash),
        lambda: create_cluster(ctx, alice, one_gpu("c")),
    ]
    with ThreadPoolExecutor(max_workers=6) as pool:
        with held_batch(ctx, pool) as placer:
            futures = queue(placer, pool, calls)
        errors = []
        for future in futures:
            with pytest.raises(Crash):
                future.result(WAIT_S)
            errors.append(future)
    assert len(errors) == 4
    for column in (Cluster.id, GpuAllocation.cluster_id, Reservation.cluster_id):
        assert count(ctx, column) == 0
    after = create_cluster(ctx, alice, one_gpu("after"))
    with ctx.read() as session:
        rows = session.execute(select(GpuAllocation.cluster_id, GpuAllocation.gpu_index)).all()
    assert rows == [(after.id, after.gpu_indices[0])]


def test_a_step_that_queues_another_is_refused_not_deadlocked(ctx: Context) -> None:
    """A step waiting for a batch of the transaction its own thread holds would never
    be answered: it is refused at once, and the placer serves the next request."""
    placer = placer_for(ctx)

    def nested(session: Session) -> None:
        placer.run(ctx, lambda _s: None)

    with pytest.raises(RuntimeError, match="may not queue"):
        placer.run(ctx, nested)
    assert placer.run(ctx, lambda _s: 7) == 7


def test_the_aged_hint_is_rebuilt_before_the_lock_and_keeps_claims_told_meanwhile(
    ctx: Context, alice: Principal, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch rebuilds an aged hint in a read of its own, before its locked
    transaction; a claim the hint is told of while that read runs is not overwritten
    by the older read: its host leaves the hint and is read again exactly."""
    ratios, now = ctx.settings.allocation_ratios, ctx.clock.now()
    with ctx.read() as session:
        hint = fleet_hint.hint_for(session)
        (host,) = capacities(session)
    real = fleet_hint._load_all
    reads: list[bool] = []

    def load_all(session: Session, ratios: AllocationRatios) -> list[Any]:
        reads.append(session.in_transaction() and lock_taken(session))
        rows = real(session, ratios)
        full = replace(host, used_gpu_indices=frozenset(g.index for g in host.gpus))
        hint.update([full], ratios)  # a claim made meanwhile
        return rows

    monkeypatch.setattr(fleet_hint, "_load_all", load_all)
    hint.invalidate()
    with ctx.read() as session:
        hint.rebuild_if_aged(session, ratios, now)
    assert host.host_id in hint.dirty
    assert hint.pick(one_gpu_request(), ctx.settings.placement_policy, (), 5) == []
    reads.clear()
    hint.invalidate()
    assert hint.aged(ratios, now)
    create_cluster(ctx, alice, one_gpu("after-rebuild"))
    assert reads == [False]
    assert not hint.aged(ratios, now)
    # Read again exactly by the batch's locked refresh: back in the hint, as it is.
    assert host.host_id not in hint.dirty
    assert hint.pick(one_gpu_request(), ctx.settings.placement_policy, (), 5) == [host.host_id]


def lock_taken(session: Session) -> bool:
    return session.info.get("gpuyard.placement_locked") is not None


def one_gpu_request() -> ResourceRequest:
    return ResourceRequest(gpu_type=A6000, gpu_count=1, vcpus=1, memory_gb=1, disk_gb=1)


class LostDatabase(Session):
    """A session of a database that has just gone away (a failover): every statement
    fails as the driver would say it."""

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        raise OperationalError("SELECT 1", {}, Exception("server closed the connection"))


def test_a_database_lost_before_the_batch_answers_every_waiter_with_it(ctx: Context) -> None:
    """The batch's first read (the aged hint's rebuild, before its transaction) fails:
    each create of the batch, the one leading it and the ones waiting, gets that
    failure; none is answered as if it had succeeded with nothing."""
    lost = replace(ctx, sessions=sessionmaker(**{**ctx.sessions.kw, "class_": LostDatabase}))
    calls: list[Callable[[], Any]] = [
        lambda: placer_for(ctx).run(lost, lambda _s: "stored"),
        lambda: placer_for(ctx).run(lost, lambda _s: "stored"),
    ]
    with ThreadPoolExecutor(max_workers=4) as pool:
        with held_batch(ctx, pool) as placer:
            futures = queue(placer, pool, calls)
            # Past the hint's age: the next batch reads it again first.
            ctx.clock.advance((fleet_hint.MAX_AGE * 2).total_seconds())  # type: ignore[attr-defined]
        answers = [outcome(f) for f in futures]
    assert all(isinstance(a, OperationalError) for a in answers), answers
    assert placer_for(ctx).run(ctx, lambda _s: 7) == 7
