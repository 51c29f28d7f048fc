"""A poisoned stored policy (written before the bounds existed, or by hand) stops
neither the watch of the other clusters nor any read or start of its own cluster."""

from __future__ import annotations

import math
from typing import Any

from sqlalchemy import func, select, text, update

from gpuyard.api.rest.schemas.cluster_json import cluster_v1
from gpuyard.core.autoterm import Rule
from gpuyard.reconciler.duties.autoterminate import AutoTerminator, Fired
from gpuyard.reconciler.loop import Reconciler
from gpuyard.services.clock import FakeClock
from gpuyard.services.clusters import use_cases as uc
from gpuyard.services.clusters.requests import CreateCluster, StartCluster
from gpuyard.services.clusters.views import load_visible
from gpuyard.services.context import Context
from gpuyard.services.tenancy.auth import Principal
from gpuyard.store.schema import Cluster, Event
from gpuyard.testing.fake_runtime import FakeRuntime

# What a pre-bounds server stored, or someone wrote by hand. NaN and undecodable text
# only fit SQLite's JSON (PostgreSQL's json type refuses them at the write).
POISON: list[Any] = [
    {"enabled": True, "cost_limit_usd": 1e300, "action": "stop"},
    {"enabled": True, "max_runtime_hours": 0.01, "action": None},
    "not a policy",
    [1, 2, 3],
]
SQLITE_POISON: list[Any] = [{"enabled": True, "idle_minutes": math.nan}]
UNDECODABLE = "{not json"


def _cpu_cluster(ctx: Context, p: Principal, rec: Reconciler, policy: dict[str, Any]) -> str:
    body = CreateCluster.model_validate(
        {"docker_image": "img", "cpu_cores": 1, "memory_gb": 1, "auto_terminate": policy}
    )
    cid = uc.create_cluster(ctx, p, body).id
    for _ in range(2):
        rec.driver.drive(cid)
    assert uc.get_cluster(ctx, p, cid).status == "running"
    return cid


def _poison(ctx: Context, cluster_id: str, raw: Any) -> None:
    with ctx.transaction() as session:
        if raw is UNDECODABLE:
            session.execute(
                text("UPDATE clusters SET auto_terminate = :v WHERE id = :id"),
                {"v": raw, "id": cluster_id},
            )
        else:
            session.execute(
                update(Cluster).where(Cluster.id == cluster_id).values(auto_terminate=raw)
            )
        session.execute(
            update(Cluster).where(Cluster.id == cluster_id).values(version=Cluster.version + 1)
        )


def _pass(at: AutoTerminator) -> list[Fired]:
    """One pass as the reconciler loop runs it: an exception ends only that pass."""
    try:
        return at.run()
    except Exception:
        return []


def _problems(ctx: Context, cluster_id: str) -> list[str]:
    with ctx.read() as session:
        return list(
            session.scalars(
                select(Event.message).where(
                    Event.cluster_id == cluster_id,
                    Event.type == "auto_terminate",
                    Event.message.like("%not%"),
                )
            )
        )


def test_one_poisoned_row_never_unwatches_the_others(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime, clock: FakeClock
) -> None:
    sqlite = ctx.settings.database_url.startswith("sqlite")
    poison = POISON + (SQLITE_POISON if sqlite else [])
    # The poisoned clusters come first, so every watched one is read after them.
    poisoned = [_cpu_cluster(ctx, alice, rec, {"enabled": False}) for _ in poison]
    watched = [_cpu_cluster(ctx, alice, rec, {"enabled": True, "max_runtime_hours": 0.01})
               for _ in range(8)]  # fmt: skip
    for cid, raw in zip(poisoned, poison, strict=True):
        _poison(ctx, cid, raw)
    fresh = AutoTerminator(ctx, runtime, gpu_utilization=lambda uuids: None)  # a restart
    assert _pass(fresh) == []
    clock.advance(37)  # past the 36 s runtime of the eight watched clusters
    fired = _pass(fresh)
    assert sorted(f.cluster_id for f in fired) == sorted(watched)
    assert {f.rule for f in fired} == {Rule.MAX_RUNTIME}
    for cid in poisoned:
        assert uc.get_cluster(ctx, alice, cid).status == "running"  # not enforced, untouched
        assert len(_problems(ctx, cid)) == 1, cid  # shown on the cluster, once
    fresh.run()
    AutoTerminator(ctx, runtime, gpu_utilization=lambda uuids: None).run()  # another restart
    assert all(len(_problems(ctx, cid)) == 1 for cid in poisoned)


def test_undecodable_json_is_isolated_to_its_cluster(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime, clock: FakeClock
) -> None:
    if not ctx.settings.database_url.startswith("sqlite"):
        return  # PostgreSQL's json type cannot hold such text
    bad = _cpu_cluster(ctx, alice, rec, {"enabled": False})
    watched = [_cpu_cluster(ctx, alice, rec, {"enabled": True, "max_runtime_hours": 0.01})
               for _ in range(8)]  # fmt: skip
    _poison(ctx, bad, UNDECODABLE)
    at = AutoTerminator(ctx, runtime, gpu_utilization=lambda uuids: None)
    _pass(at)
    clock.advance(37)
    assert sorted(f.cluster_id for f in _pass(at)) == sorted(watched)
    with ctx.read() as session:
        n = session.scalar(
            select(func.count()).where(Event.cluster_id == bad, Event.type == "auto_terminate")
        )
    assert n == 1


def test_a_poisoned_cluster_reads_shows_the_error_and_starts(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime, clock: FakeClock
) -> None:
    cid = _cpu_cluster(ctx, alice, rec, {"enabled": False})
    _poison(ctx, cid, {"enabled": True, "max_runtime_hours": 1, "action": None})
    block = cluster_v1(load_visible(ctx, alice.account_id, cid))["auto_terminate"]
    assert block["action"] is None and block["max_runtime_hours"] == 1  # as stored
    assert block["error"].startswith("action: ") and block["next_deadline_at"] is None
    assert uc.list_clusters(ctx, alice).total == 1
    uc.stop_cluster(ctx, alice, cid)
    rec.driver.drive(cid)
    uc.start_cluster(ctx, alice, cid, StartCluster())
    for _ in range(2):
        rec.driver.drive(cid)
    assert uc.get_cluster(ctx, alice, cid).status == "running"
    with ctx.read() as session:
        stored = session.scalar(select(Cluster.auto_terminate).where(Cluster.id == cid))
    assert stored == {"enabled": True, "max_runtime_hours": 1, "action": None}  # not changed
