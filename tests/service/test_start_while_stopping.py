"""A start while a cluster is stopping is recorded and made once the stop is done."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from gpuyard.core.errors import InvalidState, SnapshotNotFound, ValidationFailed
from gpuyard.reconciler.loop import Reconciler
from gpuyard.reconciler.wiring import build_reconciler
from gpuyard.services.clock import FakeClock
from gpuyard.services.clusters import use_cases as uc
from gpuyard.services.clusters.pending_starts import CALLED_OFF, REQUESTED
from gpuyard.services.clusters.requests import StartCluster
from gpuyard.services.context import Context
from gpuyard.services.tenancy.auth import Principal
from gpuyard.store.schema import Cluster, UsageInterval
from gpuyard.testing.fake_runtime import FakeRuntime
from tests.service.test_lifecycle import a6000, gpus_held, settle, status


def _gpu_intervals(ctx: Context, cid: str) -> list[tuple[object, object]]:
    with ctx.read() as s:
        rows = s.scalars(
            select(UsageInterval)
            .where(UsageInterval.cluster_id == cid, UsageInterval.meter == "gpu")
            .order_by(UsageInterval.started_at, UsageInterval.id)
        )
        return [(r.started_at, r.ended_at) for r in rows]


def _stopping(ctx: Context, alice: Principal, rec: Reconciler, n: int = 1) -> str:
    c = uc.create_cluster(ctx, alice, a6000(n, env={"A": "1"}))
    settle(rec, c.id)
    uc.stop_cluster(ctx, alice, c.id)
    assert status(ctx, alice, c.id) == "stopping"
    return c.id


def _reasons(ctx: Context, alice: Principal, cid: str) -> list[str]:
    return [e.message for e in uc.list_events(ctx, alice, cid)]


def test_start_while_stopping_is_recorded_then_made(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime, clock: FakeClock
) -> None:
    c = uc.create_cluster(ctx, alice, a6000(1))
    settle(rec, c.id)
    clock.advance(60)
    cid = uc.stop_cluster(ctx, alice, c.id).id
    body = StartCluster.model_validate(
        {
            "update_configuration": {"memory_gb": 16},
            "environment_updates": {"TOKEN": {"value": "s3cret", "secret": True}},
        }
    )
    result = uc.start_cluster(ctx, alice, cid, body)
    assert result.cluster.status == "stopping" and result.cluster.desired_status == "running"
    assert REQUESTED in _reasons(ctx, alice, cid)
    with ctx.read() as s:
        row = s.get(Cluster, cid)
        assert row is not None and row.pending_start is not None
        assert "s3cret" not in row.pending_start  # sealed: it may carry secrets
    clock.advance(10)
    rec.driver.drive(cid)  # the stop completes
    clock.advance(5)  # before the reconciler's next pass makes the start
    assert rec.wait_idle(timeout=10)
    got = uc.get_cluster(ctx, alice, cid)
    assert got.status == "running" and got.pending_start is None and got.memory_gb == 16
    spec = runtime.containers[cid].spec
    assert spec.env["TOKEN"] == "s3cret" and spec.memory_gb == 16
    assert gpus_held(ctx, cid) == [0]
    # GPU time billed once: the first run's interval closed at the stop, the second
    # opened at the start: the 5 s stopped between are not billed.
    (_, e1), (s2, e2) = _gpu_intervals(ctx, cid)
    assert e1 is not None and e2 is None and e1 < s2  # type: ignore[operator]


def test_stop_calls_a_pending_start_off(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime
) -> None:
    cid = _stopping(ctx, alice, rec)
    uc.start_cluster(ctx, alice, cid, StartCluster())
    stopped = uc.stop_cluster(ctx, alice, cid)
    assert stopped.desired_status == "stopped" and CALLED_OFF in _reasons(ctx, alice, cid)
    assert rec.wait_idle(timeout=10)
    assert status(ctx, alice, cid) == "stopped" and gpus_held(ctx, cid) == []
    # Without a pending start, a second stop of a stopping cluster is still refused.
    other = _stopping(ctx, alice, rec)
    with pytest.raises(InvalidState):
        uc.stop_cluster(ctx, alice, other)


def test_terminate_wins_over_a_pending_start(
    ctx: Context, alice: Principal, rec: Reconciler
) -> None:
    cid = _stopping(ctx, alice, rec)
    uc.start_cluster(ctx, alice, cid, StartCluster())
    uc.terminate_cluster(ctx, alice, cid)
    assert rec.wait_idle(timeout=10)
    got = uc.get_cluster(ctx, alice, cid)
    assert got.status == "terminated" and got.pending_start is None


def test_a_stopped_cluster_with_a_pending_start_is_started_after_a_crash(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime
) -> None:
    cid = _stopping(ctx, alice, rec)
    uc.start_cluster(ctx, alice, cid, StartCluster())
    rec.driver.drive(cid)  # the stop completes; the process "crashes" before the start
    assert status(ctx, alice, cid) == "stopped"
    fresh = build_reconciler(ctx, runtime)
    try:
        assert fresh.wait_idle(timeout=10)
    finally:
        fresh.stop()
    assert status(ctx, alice, cid) == "running" and gpus_held(ctx, cid) == [0]


def test_a_pending_start_that_does_not_fit_is_called_off(
    ctx: Context, alice: Principal, rec: Reconciler
) -> None:
    cid = _stopping(ctx, alice, rec)
    body = StartCluster.model_validate(
        {"update_configuration": {"gpu_count": 64}, "allow_move": False}
    )
    uc.start_cluster(ctx, alice, cid, body)  # placement is checked when it starts
    assert rec.wait_idle(timeout=10)
    got = uc.get_cluster(ctx, alice, cid)
    assert got.status == "stopped" and got.desired_status == "stopped"
    assert got.pending_start is None and gpus_held(ctx, cid) == []
    assert any(r.startswith("pending start failed") for r in _reasons(ctx, alice, cid))


def test_a_start_while_stopping_with_a_bad_body_is_refused_at_once(
    ctx: Context, alice: Principal, rec: Reconciler
) -> None:
    c = uc.create_cluster(ctx, alice, a6000(1, volume_gb=10))
    settle(rec, c.id)
    uc.stop_cluster(ctx, alice, c.id)
    nowhere = StartCluster.model_validate({"restore_from_snapshot": "snap_none"})
    with pytest.raises(SnapshotNotFound):
        uc.start_cluster(ctx, alice, c.id, nowhere)
    shrink = StartCluster.model_validate({"update_configuration": {"storage_gb": 5}})
    with pytest.raises(ValidationFailed, match="cannot shrink"):
        uc.start_cluster(ctx, alice, c.id, shrink)
    got = uc.get_cluster(ctx, alice, c.id)
    assert got.status == "stopping" and got.desired_status == "stopped"
    assert got.pending_start is None
