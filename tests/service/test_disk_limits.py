"""Disk sizes never silently disappear: a host that cannot enforce volume or container
disk sizes says so, creates there fail with a clear error unless the operator allows
it, and the sizes reach the engine — a cluster's volume and container disk at start,
a network volume's new size when it grows."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from gpuyard.core.errors import DiskNotEnforced
from gpuyard.reconciler.loop import Reconciler
from gpuyard.services.clusters import use_cases as uc
from gpuyard.services.clusters.requests import CreateCluster
from gpuyard.services.context import Context
from gpuyard.services.tenancy.auth import Principal
from gpuyard.services.volumes import network_volumes as nvs
from gpuyard.store.schema import Host
from gpuyard.testing.fake_runtime import FakeRuntime
from tests.service.test_network_volumes import mounting, new_volume, runtime_of, settle


def sized(volume_gb: int = 7, disk_gb: int = 15) -> CreateCluster:
    return CreateCluster.model_validate(
        {
            "gpu_type": "NVIDIA RTX A6000",
            "gpu_count": 1,
            "docker_image": "img",
            "volume_gb": volume_gb,
            "container_disk_gb": disk_gb,
        }
    )


def test_host_shows_unenforced_disk_and_creates_are_refused(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime
) -> None:
    ctx.settings.allow_unenforced_disk = False
    runtime.disk_problem = "container disk: overlay.size only supported for backingFS XFS"
    rec.observe()
    with ctx.read() as s:
        host = s.scalars(select(Host)).one()
        assert host.enforces_disk is False
        assert host.disk_note == runtime.disk_problem
        assert host.enforces_limits is True  # the CPU/memory note is its own
    with pytest.raises(DiskNotEnforced) as refused:
        uc.create_cluster(ctx, alice, sized())
    assert "GPUYARD_ALLOW_UNENFORCED_DISK" in refused.value.message
    assert refused.value.http_status == 409
    assert uc.list_clusters(ctx, alice).total == 0  # nothing stored
    ctx.settings.allow_unenforced_disk = True
    assert uc.create_cluster(ctx, alice, sized()).status == "starting"
    runtime.disk_problem = None
    rec.observe()
    with ctx.read() as s:
        host = s.scalars(select(Host)).one()
        assert host.enforces_disk is True and host.disk_note is None
    rec.stop()


def test_sizes_reach_the_engine(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime
) -> None:
    c = uc.create_cluster(ctx, alice, sized(volume_gb=7, disk_gb=15))
    settle(rec, c.id)
    spec = runtime.containers[c.id].spec
    assert (spec.volume_gb, spec.container_disk_gb) == (7, 15)
    assert spec.volume_name is not None
    assert runtime.volumes[spec.volume_name].size_gb == 7
    rec.stop()


def test_a_grown_network_volume_is_grown_on_the_engine(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime
) -> None:
    v = nvs.create_network_volume(ctx, alice, new_volume("data", 30))
    c = uc.create_cluster(ctx, alice, mounting(v.id))
    settle(rec, c.id)
    name = ctx.ownership.network_volume(v.id)
    assert runtime.containers[c.id].spec.volume_gb == 30
    assert runtime.volumes[name].size_gb == 30
    nvs.update_network_volume(
        ctx, alice, v.id, nvs.UpdateNetworkVolume(size=45), runtime_of=runtime_of(runtime)
    )
    assert runtime.volumes[name].size_gb == 45
    # An engine that does not answer: the size is recorded, the grow waits for a start.
    runtime.fail_next["ensure_volume"] = "engine unreachable"
    grown = nvs.update_network_volume(
        ctx, alice, v.id, nvs.UpdateNetworkVolume(size=50), runtime_of=runtime_of(runtime)
    )
    assert grown.size_gb == 50 and runtime.volumes[name].size_gb == 45
    rec.stop()
