"""Auto-termination with an injected clock: every rule fires at its deadline."""

from __future__ import annotations

import pytest

from gpuyard.api.rest.schemas.cluster_json import cluster_v1
from gpuyard.core.autoterm import Rule
from gpuyard.core.errors import ValidationFailed
from gpuyard.reconciler.duties.autoterminate import AutoTerminator
from gpuyard.reconciler.loop import Reconciler
from gpuyard.services.clock import FakeClock
from gpuyard.services.clusters import use_cases as uc
from gpuyard.services.clusters.requests import AutoTerminateUpdate, CreateCluster, StartCluster
from gpuyard.services.clusters.views import load_visible
from gpuyard.services.context import Context
from gpuyard.services.tenancy.auth import Principal
from gpuyard.store.schema import StartupSample
from gpuyard.testing.fake_runtime import FakeRuntime

A = "NVIDIA RTX A6000"


def running(ctx: Context, p: Principal, rec: Reconciler, policy: dict[str, object]) -> str:
    body = CreateCluster.model_validate(
        {"gpu_type": A, "docker_image": "img", "auto_terminate": {"enabled": True, **policy}}
    )
    cid = uc.create_cluster(ctx, p, body).id
    for _ in range(2):
        rec.driver.drive(cid)
    assert uc.get_cluster(ctx, p, cid).status == "running"
    return cid


def terminator(ctx: Context, runtime: FakeRuntime) -> AutoTerminator:
    return AutoTerminator(ctx, runtime, gpu_utilization=lambda uuids: None)


def test_max_runtime_fires_at_its_deadline(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime, clock: FakeClock
) -> None:
    cid = running(ctx, alice, rec, {"max_runtime_hours": 1})
    at = terminator(ctx, runtime)
    clock.advance(3599)
    assert at.run() == []
    assert at.seconds_until_next() == pytest.approx(1.0)
    clock.advance(1.5)
    fired = at.run()
    assert [(f.cluster_id, f.rule) for f in fired] == [(cid, Rule.MAX_RUNTIME)]
    c = uc.get_cluster(ctx, alice, cid)
    assert c.status == "stopping"
    assert c.status_reason.startswith("auto-stopped: max runtime 1 h reached at 1.0001 h")
    rec.driver.drive(cid)
    got = uc.get_cluster(ctx, alice, cid)
    assert got.status == "stopped" and "max runtime" in got.status_reason
    assert at.run() == [] and at.next_due is None


def test_cost_limit_deadline_comes_from_the_rate(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime, clock: FakeClock
) -> None:
    cid = running(ctx, alice, rec, {"cost_limit_usd": 5.0, "action": "terminate"})
    at = terminator(ctx, runtime)
    at.run()
    seconds = at.seconds_until_next()
    # 1 x A6000 at 0.76/h plus 10 GB of container disk: about 6.6 h to spend 5 USD.
    assert seconds is not None and 6.5 * 3600 < seconds < 6.6 * 3600
    clock.advance(seconds - 1)
    assert at.run() == []
    clock.advance(1.2)
    assert [f.rule for f in at.run()] == [Rule.COST_LIMIT]
    c = uc.get_cluster(ctx, alice, cid)
    assert c.status == "terminating"
    assert "auto-terminated: cost limit 5.00 USD reached at 5.00" in c.status_reason


def test_idle_needs_cpu_and_gpus_quiet_for_the_whole_window(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime, clock: FakeClock
) -> None:
    cid = running(ctx, alice, rec, {"idle_minutes": 10})
    busy_gpu = AutoTerminator(ctx, runtime, gpu_utilization=lambda uuids: [80.0])
    runtime.cpu_percent = 1.0
    busy_gpu.run(sample=True)
    assert busy_gpu.next_due is None  # the GPU works: not idle
    at = terminator(ctx, runtime)
    at.run(sample=True)  # CPU 1 %, no measurable GPU: idle from now
    clock.advance(300)
    runtime.cpu_percent = 50.0
    at.run(sample=True)  # busy again: the window restarts
    assert at.next_due is None
    runtime.cpu_percent = 2.0
    at.run(sample=True)
    clock.advance(599)
    assert at.run(sample=True) == []
    clock.advance(2)
    assert [f.rule for f in at.run(sample=False)] == [Rule.IDLE]
    assert "idle for 10 min" in uc.get_cluster(ctx, alice, cid).status_reason


def test_deadline_passed_while_down_fires_at_start(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime, clock: FakeClock
) -> None:
    cid = running(ctx, alice, rec, {"max_runtime_hours": 0.5})
    clock.advance(7200)  # the server was down past the deadline
    fresh = terminator(ctx, runtime)  # a new process
    assert [f.cluster_id for f in fresh.run()] == [cid]
    assert uc.get_cluster(ctx, alice, cid).status == "stopping"


def test_stop_start_resets_the_run_and_policy_changes_apply(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime, clock: FakeClock
) -> None:
    cid = running(ctx, alice, rec, {"max_runtime_hours": 1})
    at = terminator(ctx, runtime)
    clock.advance(3000)
    uc.stop_cluster(ctx, alice, cid)
    rec.driver.drive(cid)
    body = StartCluster.model_validate({"auto_terminate_updates": {"max_runtime_hours": 2}})
    uc.start_cluster(ctx, alice, cid, body)
    for _ in range(2):
        rec.driver.drive(cid)
    clock.advance(3600)  # 1 h into the new run: the old deadline would have fired
    assert at.run() == []
    assert at.seconds_until_next() == pytest.approx(3600)


def test_disabled_policy_never_fires(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime, clock: FakeClock
) -> None:
    body = CreateCluster.model_validate(
        {"gpu_type": A, "docker_image": "img",
         "auto_terminate": {"enabled": False, "max_runtime_hours": 0.1}}
    )  # fmt: skip
    cid = uc.create_cluster(ctx, alice, body).id
    rec.driver.drive(cid)
    clock.advance(86400)
    assert terminator(ctx, runtime).run() == []


def test_a_limit_spent_before_running_is_refused(
    ctx: Context, alice: Principal, rec: Reconciler, clock: FakeClock
) -> None:
    with ctx.transaction() as session:
        session.add(StartupSample(seconds=60.0, created_at=clock.now()))
    body = CreateCluster.model_validate(
        {"gpu_type": A, "docker_image": "img",
         "auto_terminate": {"enabled": True, "max_runtime_hours": 0.01}}
    )  # fmt: skip
    with pytest.raises(ValidationFailed) as exc:
        uc.create_cluster(ctx, alice, body)
    assert exc.value.details["field"] == "auto_terminate"
    assert "max runtime 0.01 h would be reached before the cluster is running" in exc.value.message
    assert uc.list_clusters(ctx, alice).total == 0  # nothing stored
    cheap = body.model_copy(update={"auto_terminate": None})
    cid = uc.create_cluster(ctx, alice, cheap).id
    rec.driver.drive(cid)
    uc.stop_cluster(ctx, alice, cid)
    rec.driver.drive(cid)
    spent = StartCluster.model_validate(
        {"auto_terminate_updates": {"enabled": True, "cost_limit_usd": 0.001}}
    )
    with pytest.raises(ValidationFailed, match=r"cost limit 0\.00 USD"):
        uc.start_cluster(ctx, alice, cid, spent)


def test_the_cluster_shows_what_fires_next(
    ctx: Context, alice: Principal, rec: Reconciler, clock: FakeClock
) -> None:
    cid = running(ctx, alice, rec, {"max_runtime_hours": 2, "cost_limit_usd": 100})
    block = cluster_v1(load_visible(ctx, alice.account_id, cid))["auto_terminate"]
    assert block["enabled"] and block["max_runtime_hours"] == 2
    assert block["next_rule"] == "max_runtime" and block["next_action"] == "stop"
    assert block["next_deadline_at"] == "2026-01-01T02:00:00Z"


def test_policy_changed_mid_run(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime, clock: FakeClock
) -> None:
    cid = running(ctx, alice, rec, {"max_runtime_hours": 2})
    at = terminator(ctx, runtime)
    clock.advance(3600)
    assert at.run() == []
    longer = AutoTerminateUpdate.model_validate({"max_runtime_hours": 4})
    uc.update_auto_terminate(ctx, alice, cid, longer)
    assert at.run() == [] and at.seconds_until_next() == pytest.approx(3 * 3600)
    passed = AutoTerminateUpdate.model_validate({"max_runtime_hours": 0.5, "action": "terminate"})
    uc.update_auto_terminate(ctx, alice, cid, passed)
    assert [f.rule for f in at.run()] == [Rule.MAX_RUNTIME]  # already passed: fires now
    assert uc.get_cluster(ctx, alice, cid).status == "terminating"
