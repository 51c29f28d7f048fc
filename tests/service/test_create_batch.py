"""Plain creates recorded by the placer's batch writer (services/clusters/create_batch.py),
on SQLite and PostgreSQL: the rows are those the create's own step writes, refusals
are answered by the step (only the refused create is absent), quotas count the
batch's earlier creates, other tenants stay apart, and a writer that fails leaves
nothing and hands the batch to the steps.

Batches are formed as in test_placement_batch.py: the placer's lead is held by a
waiting step while the creates queue behind it (waiting on the placer's queue)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import insert, select, update
from sqlalchemy.orm import Session

from gpuyard.core.billing.quotas import LimitChange
from gpuyard.core.errors import (
    AccountSuspended,
    BudgetExhausted,
    InsufficientCapacity,
    NotFound,
    QuotaExceeded,
)
from gpuyard.core.models import PortSpec
from gpuyard.services.billing import quotas
from gpuyard.services.capacity.batch_claims import BatchClaims
from gpuyard.services.capacity.placement_batch import DECLINED, Placer, placer_for
from gpuyard.services.clock import FakeClock
from gpuyard.services.clusters.host_checks import refuse_host_of_new
from gpuyard.services.clusters.requests import CreateCluster
from gpuyard.services.clusters.use_cases import create_cluster
from gpuyard.services.context import Context
from gpuyard.services.idempotency import ROUTE_CLUSTERS, Claim, claim_for, create_once
from gpuyard.services.tenancy.auth import Principal
from gpuyard.store.schema import (
    Account,
    Cluster,
    Event,
    GpuAllocation,
    IdempotencyKey,
    PortAllocation,
    Reservation,
    UsageInterval,
)
from tests.conftest import new_operator
from tests.service.test_placement_batch import A6000, WAIT_S, held_batch, outcome, queue


def one_gpu(name: str, **kw: Any) -> CreateCluster:
    return CreateCluster(name=name, gpu_type=A6000, gpu_count=1, docker_image="img", **kw)


def by_step(
    ctx: Context, who: Principal, body: CreateCluster, idempotency: Claim | None = None
) -> Cluster:
    """The same create, recorded by its own step only (a ``record_with`` is an option
    the batch writer leaves to the step)."""
    return create_cluster(ctx, who, body, idempotency=idempotency, record_with=lambda _s, _c: None)


def _row(session: Session, table: Any, where: Any) -> list[dict[str, Any]]:
    return [dict(r._mapping) for r in session.execute(select(table.__table__).where(where))]


def _rows_of(session: Session, cluster_id: str) -> dict[str, list[dict[str, Any]]]:
    return {
        "cluster": _row(session, Cluster, Cluster.id == cluster_id),
        "reservation": _row(session, Reservation, Reservation.cluster_id == cluster_id),
        "gpus": _row(session, GpuAllocation, GpuAllocation.cluster_id == cluster_id),
        "ports": _row(session, PortAllocation, PortAllocation.cluster_id == cluster_id),
        "events": _row(session, Event, Event.cluster_id == cluster_id),
        "intervals": _row(session, UsageInterval, UsageInterval.cluster_id == cluster_id),
        "keys": _row(session, IdempotencyKey, IdempotencyKey.resource_id == cluster_id),
    }


def assert_same_rows(ctx: Context, fast: Cluster, slow: Cluster) -> None:
    """``fast`` (the writer's) and ``slow`` (the step's) hold the same rows, column for
    column, but for the ids and the GPU and port each got; ``fast`` is as stored."""
    differ = {"id", "gpu_indices", "ports"}
    with ctx.read() as session:
        a, b = _rows_of(session, fast.id), _rows_of(session, slow.id)
    (ca,), (cb,) = a["cluster"], b["cluster"]
    assert {k: v for k, v in ca.items() if k not in differ} == {
        k: v for k, v in cb.items() if k not in differ
    }
    assert ca["open_rate_micro"] > 0 and ca["billed_run_from"] is not None
    assert [p["internal_port"] for p in ca["ports"]] == [p["internal_port"] for p in cb["ports"]]
    assert {p["host_port"] for p in ca["ports"]}.isdisjoint(p["host_port"] for p in cb["ports"])

    def without(rows: list[dict[str, Any]], *keys: str) -> list[dict[str, Any]]:
        return [{k: v for k, v in r.items() if k not in keys} for r in rows]

    ids = ("id", "cluster_id")
    assert without(a["reservation"], *ids) == without(b["reservation"], *ids)
    assert without(a["events"], *ids) == without(b["events"], *ids)
    assert without(a["intervals"], *ids) == without(b["intervals"], *ids)
    assert without(a["gpus"], "cluster_id", "gpu_index") == without(
        b["gpus"], "cluster_id", "gpu_index"
    )
    keyed = ("id", "key", "resource_id", "request_hash")
    assert without(a["keys"], *keyed) == without(b["keys"], *keyed)
    assert sorted((p["internal_port"], p["protocol"]) for p in a["ports"]) == sorted(
        (p["internal_port"], p["protocol"]) for p in b["ports"]
    )
    # The answer is the cluster as stored.
    assert (fast.status, fast.version, fast.host_id, fast.gpu_indices, fast.ports) == (
        ca["status"],
        ca["version"],
        ca["host_id"],
        ca["gpu_indices"],
        ca["ports"],
    )


def test_the_writer_records_what_the_step_records(ctx: Context, alice: Principal) -> None:
    """One create through the batch writer, the same through its step: every column of
    the cluster (its ledger totals included), its reservation, ports, event and usage
    intervals are the same, but for the ids and the GPU and port each got."""
    body = one_gpu("same", ports=[PortSpec(internal_port=8888), PortSpec(internal_port=22)])
    placer = placer_for(ctx)
    written = placer.written
    fast = create_cluster(ctx, alice, body)
    assert placer.written == written + 1
    slow = by_step(ctx, alice, body)
    assert placer.written == written + 1
    assert [p["internal_port"] for p in fast.ports] == [8888, 22]
    assert_same_rows(ctx, fast, slow)


def test_a_batch_of_writer_creates_records_what_steps_record(
    ctx: Context, alice: Principal
) -> None:
    """Three keyed creates in one batch (several rows a table: one statement each,
    unnest on PostgreSQL), each compared with the same create by its step."""
    body = one_gpu("many", ports=[PortSpec(internal_port=8888)], env={"A": "1"})

    def keyed(i: int, step: bool) -> Callable[[], Cluster]:
        claim = claim_for(ctx, alice, ROUTE_CLUSTERS, f"k{i}", body.model_dump())
        create = by_step if step else create_cluster

        def call() -> Cluster:
            found: list[Cluster] = []

            def make(c: Claim | None) -> str:
                found.append(create(ctx, alice, body, idempotency=c))
                return found[0].id

            create_once(ctx, claim, make)
            return found[0]

        return call

    placer = placer_for(ctx)
    written = placer.written
    with ThreadPoolExecutor(max_workers=6) as pool:
        with held_batch(ctx, pool) as held:
            futures = queue(held, pool, [keyed(i, False) for i in range(3)])
        batch = [f.result(WAIT_S) for f in futures]
    assert placer.written == written + 3
    slow = keyed(9, True)()
    assert len({c.host_id for c in [*batch, slow]}) == 1
    for fast in batch:
        assert_same_rows(ctx, fast, slow)


def test_writer_and_steps_in_one_batch_never_hand_a_gpu_twice(
    ctx: Context, alice: Principal
) -> None:
    """16 creates in one batch, every other one left to its step: 4 A6000 are placed
    once each (whichever path took them), the other 12 refused by their own steps."""

    def create(i: int) -> Callable[[], Cluster]:
        body = one_gpu(f"c{i}")
        return (
            (lambda: by_step(ctx, alice, body))
            if i % 2
            else (lambda: create_cluster(ctx, alice, body))
        )

    with ThreadPoolExecutor(max_workers=20) as pool:
        with held_batch(ctx, pool) as placer:
            futures = queue(placer, pool, [create(i) for i in range(16)])
        results = [outcome(f) for f in futures]
    placed = [r for r in results if isinstance(r, Cluster)]
    assert len(placed) == 4
    with ctx.read() as session:
        rows = session.execute(
            select(GpuAllocation.host_id, GpuAllocation.gpu_index).join(
                Cluster, Cluster.id == GpuAllocation.cluster_id
            )
        ).all()
        names = set(session.scalars(select(Cluster.name)))
    assert len(rows) == len(set(rows)) == 4
    assert names == {c.name for c in placed}


def test_a_quota_counts_the_batch_and_refuses_only_the_create_past_it(
    ctx: Context, alice: Principal, bob: Principal
) -> None:
    """Alice may hold 2 GPUs: of her 4 creates in one batch the first 2 place and the
    3rd and 4th are refused QUOTA_EXCEEDED by their steps; Bob's create in the same
    batch is neither counted against her quota nor refused; the refused leave no row."""
    quotas.set_quotas(ctx, new_operator(ctx), alice.account_id, LimitChange(gpus=2))
    calls: list[Callable[[], Any]] = [
        lambda: create_cluster(ctx, alice, one_gpu("a1")),
        lambda: create_cluster(ctx, alice, one_gpu("a2")),
        lambda: create_cluster(ctx, bob, one_gpu("b1")),
        lambda: create_cluster(ctx, alice, one_gpu("a3")),
        lambda: create_cluster(ctx, alice, one_gpu("a4")),
    ]
    with ThreadPoolExecutor(max_workers=8) as pool:
        with held_batch(ctx, pool) as placer:
            futures = queue(placer, pool, calls)
        a1, a2, b1, a3, a4 = (outcome(f) for f in futures)
    assert all(isinstance(c, Cluster) for c in (a1, a2, b1))
    for refused in (a3, a4):
        assert isinstance(refused, QuotaExceeded)
        assert refused.details["in_use"] == 2
    with ctx.read() as session:
        names = set(session.scalars(select(Cluster.name)))
        held = set(session.scalars(select(GpuAllocation.cluster_id)))
    assert names == {"a1", "a2", "b1"}
    assert held == {a1.id, a2.id, b1.id}


def test_another_tenant_in_the_batch_gets_nothing_of_alices(
    ctx: Context, alice: Principal, bob: Principal
) -> None:
    """In one batch: Bob names Alice's project (404, as outside a batch), and Bob and
    Alice send the same Idempotency-Key string (keys are per account: both place,
    neither is answered the other's cluster)."""

    def keyed(who: Principal, name: str) -> Callable[[], tuple[str, bool]]:
        body = one_gpu(name)
        claim = claim_for(ctx, who, ROUTE_CLUSTERS, "same-key", body.model_dump())
        return lambda: create_once(
            ctx, claim, lambda c: create_cluster(ctx, who, body, idempotency=c).id
        )

    calls: list[Callable[[], Any]] = [
        keyed(alice, "alice"),
        lambda: create_cluster(
            ctx, bob, one_gpu("bob-in-alice", project_id=alice.default_project_id)
        ),
        keyed(bob, "bob"),
    ]
    with ThreadPoolExecutor(max_workers=6) as pool:
        with held_batch(ctx, pool) as placer:
            futures = queue(placer, pool, calls)
        mine, intruder, theirs = (outcome(f) for f in futures)
    assert isinstance(intruder, NotFound)
    assert mine[1] is False and theirs[1] is False and mine[0] != theirs[0]
    with ctx.read() as session:
        owners = dict(session.execute(select(Cluster.name, Cluster.project_id)).all())
        keys = dict(
            session.execute(select(IdempotencyKey.account_id, IdempotencyKey.resource_id)).all()
        )
    assert owners == {"alice": alice.default_project_id, "bob": bob.default_project_id}
    assert keys == {alice.account_id: mine[0], bob.account_id: theirs[0]}


def test_an_expired_key_is_replaced_by_the_writer(ctx: Context, alice: Principal) -> None:
    """A key row that expired counts as absent: the create places and its row replaces
    the old one."""
    body = one_gpu("again")
    claim = claim_for(ctx, alice, ROUTE_CLUSTERS, "old-key", body.model_dump())
    assert claim is not None
    past = ctx.clock.now() - timedelta(days=30)
    with ctx.transaction() as session:
        session.execute(
            insert(IdempotencyKey),
            [
                {
                    "account_id": alice.account_id,
                    "route": ROUTE_CLUSTERS,
                    "key": "old-key",
                    "request_hash": "0" * 64,
                    "resource_id": "gone",
                    "created_at": past,
                    "expires_at": past + timedelta(hours=1),
                }
            ],
        )
    placer = placer_for(ctx)
    written = placer.written
    made, replayed = create_once(
        ctx, claim, lambda c: create_cluster(ctx, alice, body, idempotency=c).id
    )
    assert not replayed and placer.written == written + 1
    with ctx.read() as session:
        rows = session.execute(select(IdempotencyKey.resource_id, IdempotencyKey.request_hash))
        assert list(rows) == [(made, claim.request_hash)]


class Failing:
    """A batch writer that writes a row, then fails."""

    def write(self, session: Session, items: list[Any]) -> list[Any]:
        session.execute(
            insert(Event),
            [{"cluster_id": "writerxxxxxxxx", "type": "status", "message": "half"}],
        )
        raise RuntimeError("the writer broke")


class Declining:
    def write(self, session: Session, items: list[Any]) -> list[Any]:
        return [DECLINED for _ in items]


@pytest.mark.parametrize("writer", [Failing(), Declining()], ids=["fails", "declines"])
def test_a_writer_that_fails_or_declines_leaves_each_request_to_its_step(
    ctx: Context, writer: Any
) -> None:
    """Whatever the writer wrote is gone when it fails; every request is then answered
    by its own step, in one batch or alone."""
    placer = Placer()

    def step(i: int) -> Callable[[Session], int]:
        def run(session: Session) -> int:
            session.execute(
                insert(Event), [{"cluster_id": f"step{i:010d}", "type": "t", "message": "m"}]
            )
            return i

        return run

    assert placer.run(ctx, step(0), (writer, 0)) == 0
    with ThreadPoolExecutor(max_workers=6) as pool:
        hold = _Hold()
        release = pool.submit(placer.run, ctx, hold)
        assert hold.holding.wait(WAIT_S)
        futures = []
        for i in range(1, 4):
            futures.append(pool.submit(placer.run, ctx, step(i), (writer, i)))
            assert placer.wait_queued(i, WAIT_S)
        hold.release()
        release.result(WAIT_S)
        assert [f.result(WAIT_S) for f in futures] == [1, 2, 3]
    assert placer.written == 0
    with ctx.read() as session:
        stored = set(session.scalars(select(Event.cluster_id).where(Event.type == "t")))
        half = session.scalars(select(Event.id).where(Event.message == "half")).all()
    assert stored == {f"step{i:010d}" for i in range(4)}
    assert half == []


class _Hold:
    """A step that holds the placer's lead until released."""

    def __init__(self) -> None:
        self.holding, self._go = threading.Event(), threading.Event()

    def release(self) -> None:
        self._go.set()

    def __call__(self, _session: Session) -> None:
        self.holding.set()
        assert self._go.wait(WAIT_S)


def test_the_answer_is_the_object_the_step_answers(ctx: Context, alice: Principal) -> None:
    """What create_cluster returns through the writer holds the same values, of the
    same types (times, JSON), as what the step returns: views render either alike."""
    body = one_gpu("answer", env={"A": "1"}, docker_entrypoint=["sh", "-c"])
    fast = create_cluster(ctx, alice, body)
    slow = by_step(ctx, alice, body)
    differ = {"id", "gpu_indices", "ports", "billed_run_from", "open_rate_micro", "open_since"}
    for column in Cluster.__table__.columns:
        if column.key in differ:
            continue
        mine, theirs = getattr(fast, column.key), getattr(slow, column.key)
        assert (column.key, mine, type(mine)) == (column.key, theirs, type(theirs))


def test_a_closed_accounts_create_is_refused_by_its_step(
    ctx: Context, alice: Principal, bob: Principal
) -> None:
    """Alice's account is suspended, Bob's budget spent: the writer declines both (one
    read of each account with its quotas) and their steps refuse them in their words."""
    with ctx.transaction() as session:
        session.execute(
            update(Account).where(Account.id == alice.account_id).values(status="suspended")
        )
        session.execute(
            update(Account).where(Account.id == bob.account_id).values(exhausted_at=ctx.clock.now())
        )
    placer = placer_for(ctx)
    written = placer.written
    with pytest.raises(AccountSuspended):
        create_cluster(ctx, alice, one_gpu("a"))
    with pytest.raises(BudgetExhausted):
        create_cluster(ctx, bob, one_gpu("b"))
    assert placer.written == written
    with ctx.read() as session:
        assert session.scalars(select(Cluster.id)).all() == []


def test_a_key_is_judged_live_at_its_own_creates_time(
    ctx: Context, alice: Principal, clock: FakeClock
) -> None:
    """In one batch, the first create made at T+20 s and the second at T, whose key's
    row expires at T+10 s: that row is live for the second create (its step answers
    it: the key is held), not expired as it would be at the first create's time."""
    body = one_gpu("keyed")
    claim = claim_for(ctx, alice, ROUTE_CLUSTERS, "late-key", body.model_dump())
    assert claim is not None
    start = clock.now()
    with ctx.transaction() as session:
        session.execute(
            insert(IdempotencyKey),
            [
                {
                    "account_id": alice.account_id,
                    "route": ROUTE_CLUSTERS,
                    "key": "late-key",
                    "request_hash": claim.request_hash,
                    "resource_id": "earlier",
                    "created_at": start,
                    "expires_at": start + timedelta(seconds=10),
                }
            ],
        )

    with ThreadPoolExecutor(max_workers=4) as pool:
        with held_batch(ctx, pool) as placer:
            clock.advance(20)
            first = pool.submit(create_cluster, ctx, alice, one_gpu("later"))
            assert placer.wait_queued(1, WAIT_S)
            clock.advance(-20)
            second = pool.submit(create_cluster, ctx, alice, body, idempotency=claim)
            assert placer.wait_queued(2, WAIT_S)
        assert isinstance(outcome(first), Cluster)
        assert isinstance(outcome(second), Exception)
    with ctx.read() as session:
        rows = session.execute(select(IdempotencyKey.resource_id)).scalars().all()
    assert rows == ["earlier"]


def test_a_host_without_its_row_refuses_and_the_step_decides(
    ctx: Context, alice: Principal, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The host checks refuse a host whose row they were not given (they fail closed:
    nothing says its limits, disk or ports are kept); the writer then declines the
    create and its step, which reads the host itself, places it."""
    with pytest.raises(InsufficientCapacity):
        refuse_host_of_new(None, 12345, ctx, [])
    monkeypatch.setattr(BatchClaims, "host", lambda _self, _host_id: None)
    placer = placer_for(ctx)
    written = placer.written
    made = create_cluster(ctx, alice, one_gpu("stepped"))
    assert placer.written == written and made.host_id is not None
