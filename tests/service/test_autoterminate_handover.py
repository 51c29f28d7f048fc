"""Auto-termination handed between replicas: idle windows sampled under an earlier
hold of the duty's lease are not trusted after another replica held it."""

from __future__ import annotations

from gpuyard.core.autoterm import Rule
from gpuyard.reconciler.duties.autoterminate import AutoTerminator
from gpuyard.reconciler.loop import Reconciler
from gpuyard.services.clock import FakeClock
from gpuyard.services.clusters import use_cases as uc
from gpuyard.services.clusters.requests import CreateCluster
from gpuyard.services.context import Context
from gpuyard.services.tenancy.auth import Principal
from gpuyard.testing.fake_runtime import FakeRuntime


def running_idle_watched(ctx: Context, p: Principal, rec: Reconciler) -> str:
    body = CreateCluster.model_validate(
        {
            "gpu_type": "NVIDIA RTX A6000",
            "docker_image": "img",
            "auto_terminate": {"enabled": True, "idle_minutes": 10},
        }
    )
    cid = uc.create_cluster(ctx, p, body).id
    for _ in range(2):
        rec.driver.drive(cid)
    assert uc.get_cluster(ctx, p, cid).status == "running"
    return cid


def test_a_new_fence_restarts_the_idle_window(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime, clock: FakeClock
) -> None:
    cid = running_idle_watched(ctx, alice, rec)
    at = AutoTerminator(ctx, runtime, gpu_utilization=lambda uuids: None)
    runtime.cpu_percent = 1.0
    at.run(sample=True, fence=1)  # idle from now, as this replica saw it
    assert cid in at.idle_since
    # Another replica held the duty meanwhile (fence 2) and gave it back (fence 3);
    # whatever it saw, this replica's old window does not count.
    clock.advance(601)
    assert at.run(sample=True, fence=3) == []
    assert at.idle_since[cid] == clock.now()
    clock.advance(599)
    assert at.run(sample=True, fence=3) == []
    clock.advance(2)
    assert [f.rule for f in at.run(sample=True, fence=3)] == [Rule.IDLE]


def test_the_same_fence_keeps_the_idle_window(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime, clock: FakeClock
) -> None:
    cid = running_idle_watched(ctx, alice, rec)
    at = AutoTerminator(ctx, runtime, gpu_utilization=lambda uuids: None)
    runtime.cpu_percent = 1.0
    at.run(sample=True, fence=4)
    clock.advance(601)
    assert [(f.cluster_id, f.rule) for f in at.run(sample=True, fence=4)] == [(cid, Rule.IDLE)]
