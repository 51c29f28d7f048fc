"""A start whose engine step fails once is tried again after a back-off and runs; the
cluster stays ``starting`` (its GPUs held) meanwhile, its events say what happened,
and a stop during the back-off ends the retries. Fake runtime, real database,
injected clock."""

from __future__ import annotations

from sqlalchemy import select

from gpuyard.core.errors import RuntimeFailure
from gpuyard.reconciler.loop import Reconciler
from gpuyard.services.clock import FakeClock
from gpuyard.services.clusters import use_cases as uc
from gpuyard.services.context import Context
from gpuyard.services.tenancy.auth import Principal
from gpuyard.store.schema import Event
from gpuyard.testing.fake_runtime import FakeRuntime
from tests.service.test_lifecycle import a6000, gpus_held, settle, status


def retry_events(ctx: Context, cid: str) -> list[str]:
    with ctx.read() as s:
        return list(
            s.scalars(
                select(Event.message).where(Event.cluster_id == cid, Event.type == "start_retry")
            )
        )


def test_an_engine_hiccup_at_create_is_tried_again(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime, clock: FakeClock
) -> None:
    runtime.fail_next["create"] = "database is locked"
    c = uc.create_cluster(ctx, alice, a6000(2))
    rec.driver.drive(c.id)
    assert status(ctx, alice, c.id) == "starting"
    assert gpus_held(ctx, c.id) == [0, 1]
    assert retry_events(ctx, c.id) == [
        "start attempt 1 of 3 failed: database is locked; trying again"
    ]
    settle(rec, c.id)  # within the back-off: nothing is tried
    assert runtime.calls["create"] == 1
    clock.advance(1.1)
    rec.driver.drive(c.id)
    assert status(ctx, alice, c.id) == "running"
    assert runtime.calls["create"] == 2
    assert rec.driver.start_retries.due(c.id)


def test_a_failed_readiness_check_is_tried_again(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime, clock: FakeClock
) -> None:
    runtime.fail_next["observe"] = "engine busy"
    c = uc.create_cluster(ctx, alice, a6000(1))
    rec.driver.drive(c.id)
    assert status(ctx, alice, c.id) == "starting"
    clock.advance(1.1)
    rec.driver.drive(c.id)
    assert status(ctx, alice, c.id) == "running"
    assert len(retry_events(ctx, c.id)) == 1


def test_a_stop_during_the_back_off_ends_the_retries(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime, clock: FakeClock
) -> None:
    runtime.fail_next["start"] = "netavark: iptables lock"
    c = uc.create_cluster(ctx, alice, a6000(1))
    rec.driver.drive(c.id)
    assert not rec.driver.start_retries.due(c.id)
    uc.stop_cluster(ctx, alice, c.id)
    settle(rec, c.id)
    assert status(ctx, alice, c.id) == "stopped"
    assert gpus_held(ctx, c.id) == []
    assert rec.driver.start_retries.due(c.id)


def test_a_disk_size_the_host_cannot_enforce_ends_the_start_at_once(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime
) -> None:
    runtime.fail_next["create"] = RuntimeFailure(
        "this host cannot enforce disk sizes (overlay on extfs)", {"enforces_disk": False}
    )
    c = uc.create_cluster(ctx, alice, a6000(1))
    rec.driver.drive(c.id)
    assert status(ctx, alice, c.id) == "error"
    assert retry_events(ctx, c.id) == []
    assert runtime.calls["create"] == 1
    assert gpus_held(ctx, c.id) == []
