"""Cluster lifecycle on a real database with the fake runtime, driven step by step."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from gpuyard.core.errors import (
    ClusterNotFound,
    InsufficientCapacity,
    InvalidState,
    SnapshotNotFound,
    ValidationFailed,
)
from gpuyard.reconciler.loop import Reconciler
from gpuyard.reconciler.wiring import build_reconciler
from gpuyard.runtimes.base import ContainerState
from gpuyard.services.clusters import use_cases as uc
from gpuyard.services.clusters.requests import CreateCluster, StartCluster
from gpuyard.services.context import Context
from gpuyard.services.tenancy.auth import Principal
from gpuyard.store.schema import GpuAllocation, PortAllocation, Reservation
from gpuyard.testing.fake_runtime import FakeRuntime


def a6000(n: int = 1, **kw: object) -> CreateCluster:
    return CreateCluster.model_validate(
        {"gpu_type": "NVIDIA RTX A6000", "gpu_count": n, "docker_image": "img", **kw}
    )


def settle(rec: Reconciler, cluster_id: str) -> None:
    for _ in range(5):
        rec.driver.drive(cluster_id)


def status(ctx: Context, p: Principal, cid: str) -> str:
    return uc.get_cluster(ctx, p, cid).status


def gpus_held(ctx: Context, cid: str) -> list[int]:
    with ctx.read() as s:
        return sorted(
            s.scalars(select(GpuAllocation.gpu_index).where(GpuAllocation.cluster_id == cid))
        )


def test_create_runs_with_env_ports_and_gpu_env(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime
) -> None:
    c = uc.create_cluster(
        ctx, alice, a6000(2, env={"A": "1"}, volume_gb=5, ports=[{"internal_port": 8888}])
    )
    assert c.status == "starting" and c.gpu_indices == [0, 1]
    settle(rec, c.id)
    assert status(ctx, alice, c.id) == "running"
    spec = runtime.containers[c.id].spec
    assert spec.env["A"] == "1" and spec.env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert spec.ports[0].internal_port == 8888 and spec.ports[0].external_port >= 20000
    assert spec.volume_name == ctx.ownership.volume(c.id)


def test_stop_releases_gpus_keeps_volume_and_start_reclaims(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime
) -> None:
    c = uc.create_cluster(ctx, alice, a6000(2, volume_gb=5, ports=[{"internal_port": 80}]))
    settle(rec, c.id)
    port_before = runtime.containers[c.id].spec.ports[0].external_port
    runtime.write_file(c.id, "/workspace/data.txt", "keep")
    uc.stop_cluster(ctx, alice, c.id)
    settle(rec, c.id)
    assert status(ctx, alice, c.id) == "stopped"
    assert gpus_held(ctx, c.id) == []
    assert c.id not in runtime.containers
    with ctx.read() as s:
        res = s.get(Reservation, c.id)
        assert res is not None and res.vcpus == 0 and res.volume_gb == 5
    result = uc.start_cluster(ctx, alice, c.id, StartCluster())
    assert result.cluster.status == "starting"
    settle(rec, c.id)
    assert status(ctx, alice, c.id) == "running"
    assert gpus_held(ctx, c.id) == [0, 1]
    assert runtime.volume_files(ctx.ownership.volume(c.id)) == {"data.txt": "keep"}
    assert runtime.containers[c.id].spec.ports[0].external_port == port_before


def test_start_applies_configuration_and_reports_rate(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime
) -> None:
    c = uc.create_cluster(ctx, alice, a6000(1, volume_gb=10, memory_gb=8, env={"A": "1"}))
    settle(rec, c.id)
    uc.stop_cluster(ctx, alice, c.id)
    settle(rec, c.id)
    body = StartCluster.model_validate(
        {
            "update_configuration": {
                "memory_gb": 16,
                "docker_image": "img2",
                "gpu_count": 2,
                "storage_gb": 20,
            },
            "environment_updates": {"B": "2", "A": None},
            "port_mapping_updates": [
                {"internal_port": 8888, "external_port": 0, "protocol": "tcp"}
            ],
            "auto_terminate_updates": {"enabled": True, "idle_minutes": 30},
        }
    )
    result = uc.start_cluster(ctx, alice, c.id, body)
    assert "memory_gb: 8 -> 16" in result.configuration_updates_applied
    assert "docker_image: img -> img2" in result.configuration_updates_applied
    assert result.new_rate > result.previous_rate
    assert result.rate_change_reason and "GPU count change" in result.rate_change_reason
    settle(rec, c.id)
    spec = runtime.containers[c.id].spec
    assert spec.image == "img2" and spec.env.get("B") == "2" and "A" not in spec.env
    assert spec.memory_gb == 16 and len(spec.gpu_indices) == 2
    assert [p.internal_port for p in spec.ports] == [8888]
    got = uc.get_cluster(ctx, alice, c.id)
    assert got.volume_gb == 20 and got.auto_terminate["idle_minutes"] == 30


def test_start_errors_change_nothing(ctx: Context, alice: Principal, rec: Reconciler) -> None:
    c = uc.create_cluster(ctx, alice, a6000(2, volume_gb=10))
    settle(rec, c.id)
    with pytest.raises(InvalidState) as exc:
        uc.start_cluster(ctx, alice, c.id, StartCluster())
    assert exc.value.details["current_status"] == "running"
    assert exc.value.details["required_status"] == "stopped"
    assert "stop" in exc.value.details["allowed_actions"]
    uc.stop_cluster(ctx, alice, c.id)
    settle(rec, c.id)
    before = uc.get_cluster(ctx, alice, c.id)
    shrink = StartCluster.model_validate({"update_configuration": {"storage_gb": 5}})
    with pytest.raises(ValidationFailed, match="cannot shrink"):
        uc.start_cluster(ctx, alice, c.id, shrink)
    with pytest.raises(SnapshotNotFound):
        uc.start_cluster(ctx, alice, c.id, StartCluster(restore_from_snapshot="snap_x"))
    # Someone takes the GPUs meanwhile: the start fails and nothing changes.
    other = uc.create_cluster(ctx, alice, a6000(4))
    assert other.status == "starting"
    with pytest.raises(InsufficientCapacity, match="not enough free GPUs on the host machine"):
        uc.start_cluster(
            ctx,
            alice,
            c.id,
            StartCluster.model_validate({"update_configuration": {"memory_gb": 64}}),
        )
    after = uc.get_cluster(ctx, alice, c.id)
    assert (after.status, after.memory_gb, after.version) == (
        "stopped",
        before.memory_gb,
        before.version,
    )


def test_other_account_sees_404(ctx: Context, alice: Principal, bob: Principal) -> None:
    c = uc.create_cluster(ctx, alice, a6000(1))
    with pytest.raises(ClusterNotFound):
        uc.get_cluster(ctx, bob, c.id)
    with pytest.raises(ClusterNotFound):
        uc.stop_cluster(ctx, bob, c.id)
    assert uc.list_clusters(ctx, bob).total == 0


def test_terminate_releases_everything(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime
) -> None:
    c = uc.create_cluster(ctx, alice, a6000(1, volume_gb=5, ports=[{"internal_port": 22}]))
    settle(rec, c.id)
    uc.terminate_cluster(ctx, alice, c.id)
    settle(rec, c.id)
    assert status(ctx, alice, c.id) == "terminated"
    assert c.id not in runtime.containers and ctx.ownership.volume(c.id) not in runtime.volumes
    with ctx.read() as s:
        assert s.get(Reservation, c.id) is None
        assert not list(s.scalars(select(PortAllocation).where(PortAllocation.cluster_id == c.id)))
    assert gpus_held(ctx, c.id) == []
    with pytest.raises(InvalidState):
        uc.terminate_cluster(ctx, alice, c.id)


def test_image_failure_ends_in_error_and_frees_gpus(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime
) -> None:
    runtime.fail_image("missing:latest", "not found")
    c = uc.create_cluster(ctx, alice, a6000(1, docker_image="missing:latest"))
    settle(rec, c.id)
    got = uc.get_cluster(ctx, alice, c.id)
    assert got.status == "error" and got.error_message and "missing:latest" in got.error_message
    assert gpus_held(ctx, c.id) == []
    # An errored cluster can be started again once fixed.
    fixed = StartCluster.model_validate({"update_configuration": {"docker_image": "img"}})
    uc.start_cluster(ctx, alice, c.id, fixed)
    settle(rec, c.id)
    assert status(ctx, alice, c.id) == "running"


def test_restart_recreates_container_keeping_gpus(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime
) -> None:
    c = uc.create_cluster(ctx, alice, a6000(2))
    settle(rec, c.id)
    first = runtime.containers[c.id].id
    uc.restart_cluster(ctx, alice, c.id)
    settle(rec, c.id)
    assert status(ctx, alice, c.id) == "running"
    assert runtime.containers[c.id].id != first
    assert gpus_held(ctx, c.id) == [0, 1]


def test_stop_during_start_wins(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime
) -> None:
    c = uc.create_cluster(ctx, alice, a6000(1))
    uc.stop_cluster(ctx, alice, c.id)
    settle(rec, c.id)
    assert status(ctx, alice, c.id) == "stopped"
    assert c.id not in runtime.containers


def test_resume_after_crash_mid_start(ctx: Context, alice: Principal, runtime: FakeRuntime) -> None:
    c = uc.create_cluster(ctx, alice, a6000(1))
    # A first reconciler "crashes" right after creating the container.
    runtime.ensure_image("img")
    runtime.create(
        build_reconciler(ctx, runtime).driver.specs.build(uc.get_cluster(ctx, alice, c.id))
    )
    fresh = build_reconciler(ctx, runtime)
    assert fresh.wait_idle(timeout=10)
    fresh.stop()
    assert status(ctx, alice, c.id) == "running"
    assert runtime.containers[c.id].state == ContainerState.RUNNING


def test_list_filters_and_pagination(ctx: Context, alice: Principal, rec: Reconciler) -> None:
    ids = [uc.create_cluster(ctx, alice, a6000(0, name=f"dev-{i}")).id for i in range(3)]
    uc.create_cluster(ctx, alice, a6000(0, name="train-1"))
    for cid in ids:
        settle(rec, cid)
    page = uc.list_clusters(ctx, alice, search="dev-", per_page=2)
    assert page.total == 3 and len(page.clusters) == 2
    assert uc.list_clusters(ctx, alice, status="running").total == 3
    with pytest.raises(ValidationFailed):
        uc.list_clusters(ctx, alice, status="bogus")


def test_failed_stop_keeps_gpus_and_retries(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime
) -> None:
    c = uc.create_cluster(ctx, alice, a6000(2))
    settle(rec, c.id)
    uc.stop_cluster(ctx, alice, c.id)
    runtime.fail_next["stop"] = "engine unreachable"
    rec.driver.drive(c.id)
    # The container may still run: nothing is released until the engine confirms.
    assert status(ctx, alice, c.id) == "stopping" and gpus_held(ctx, c.id) == [0, 1]
    rec.driver.drive(c.id)
    assert status(ctx, alice, c.id) == "stopped" and gpus_held(ctx, c.id) == []
