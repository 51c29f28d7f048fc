"""The local host's row follows the machine's stable id, not its hostname: a rename
keeps the row and never offers its GPUs twice; a row from before host ids is adopted."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest
from sqlalchemy import func, select

from gpuyard.core.models import CloudType, GpuSource
from gpuyard.core.placement import cuda_version_key
from gpuyard.services.clusters import use_cases as uc
from gpuyard.services.clusters.requests import CreateCluster
from gpuyard.services.context import Context
from gpuyard.services.fleet.discovery import (
    LocalInventory,
    discover_nvml_cuda,
    discover_nvml_gpus,
    parse_declared_gpus,
)
from gpuyard.services.fleet.hosts import capacities, register_host
from gpuyard.services.fleet.identity import HOST_ID_FILE, derive_from_machine_id
from gpuyard.services.installation.bootstrap import register_local_host
from gpuyard.services.tenancy.auth import Principal
from gpuyard.store.schema import GpuAllocation, Host, HostGpu


def host_rows(ctx: Context) -> list[Host]:
    with ctx.read() as s:
        return list(s.scalars(select(Host).order_by(Host.id)))


def gpus_on_offer(ctx: Context) -> int:
    with ctx.read() as s:
        return sum(len(c.gpus) for c in capacities(s))


def host_id_of(ctx: Context) -> str:
    return (ctx.settings.home / HOST_ID_FILE).read_text().strip()


def inventory(spec: str = "NVIDIA RTX A6000:2") -> LocalInventory:
    return LocalInventory(
        vcpus=8,
        memory_gb=32,
        disk_gb=100,
        gpus=parse_declared_gpus(spec),
        gpu_source=GpuSource.DECLARED,
        declared=(),
    )


def register(ctx: Context, machine_id: str, name: str) -> int:
    """Another machine registering itself (as a server on that machine would)."""
    with ctx.transaction() as s:
        return register_host(
            s,
            machine_id=machine_id,
            name=name,
            location="local",
            cloud_type=CloudType.SECURE,
            address="127.0.0.1",
            engine_url=None,
            inventory=inventory(),
        ).id


def test_the_local_host_row_carries_the_stored_id(ctx: Context) -> None:
    [host] = host_rows(ctx)
    assert host.machine_id == host_id_of(ctx)


def test_a_hostname_change_keeps_the_row_and_the_gpus_on_offer(
    ctx: Context, alice: Principal
) -> None:
    [before] = host_rows(ctx)
    offered = gpus_on_offer(ctx)
    assert offered == 8
    cluster = uc.create_cluster(
        ctx,
        alice,
        CreateCluster(gpu_type="NVIDIA RTX A6000", gpu_count=2, docker_image="img"),
    )
    host_id = register_local_host(ctx, None, hostname="renamed-machine")
    assert host_id == before.id
    [after] = host_rows(ctx)
    assert (after.id, after.name, after.machine_id) == (
        before.id,
        "renamed-machine",
        before.machine_id,
    )
    assert gpus_on_offer(ctx) == offered
    with ctx.read() as s:
        assert s.scalar(select(func.count()).select_from(HostGpu)) == 8
        held = s.scalars(select(GpuAllocation).where(GpuAllocation.cluster_id == cluster.id))
        assert sorted(a.host_id for a in held) == [before.id, before.id]
    # And back again: still the one row.
    register_local_host(ctx, None, hostname=before.name)
    assert [(h.id, h.name) for h in host_rows(ctx)] == [(before.id, before.name)]


def test_the_machine_id_file_decides_on_the_first_start_only(ctx: Context, tmp_path: Path) -> None:
    """The fixture's first start stored an id; a machine-id file seen later (another
    content, or one appearing where there was none) changes nothing."""
    stored = host_id_of(ctx)
    mid = tmp_path / "machine-id"
    mid.write_text("a-machine-id-different-from-the-one-the-first-start-saw\n")
    assert derive_from_machine_id(mid) != stored
    register_local_host(ctx, None, machine_id_path=mid, hostname="other")
    assert host_id_of(ctx) == stored
    assert [h.machine_id for h in host_rows(ctx)] == [stored]


def test_a_new_home_derives_its_id_from_the_injected_machine_id(
    ctx: Context, tmp_path: Path
) -> None:
    mid = tmp_path / "machine-id"
    mid.write_text("cafe0000cafe0000cafe0000cafe0000\n")
    (ctx.settings.home / HOST_ID_FILE).unlink()
    [old] = host_rows(ctx)
    # A lost home on the same machine: a new id (derived), a new row beside the old.
    new_id = register_local_host(ctx, None, machine_id_path=mid, hostname=old.name)
    assert host_id_of(ctx) == derive_from_machine_id(mid)
    rows = {h.id: h for h in host_rows(ctx)}
    assert rows[new_id].machine_id == derive_from_machine_id(mid)
    # The old row keeps the hostname (names are unique); the new one is told apart.
    assert rows[old.id].name == old.name
    assert rows[new_id].name == f"{old.name}-{rows[new_id].machine_id[:8]}"


def test_a_row_from_before_host_ids_is_adopted_once(ctx: Context) -> None:
    [host] = host_rows(ctx)
    with ctx.transaction() as s:
        s.get_one(Host, host.id).machine_id = None
    # The upgrade's first start: same hostname, no id on the row yet.
    assert register_local_host(ctx, None, hostname=host.name) == host.id
    [adopted] = host_rows(ctx)
    assert adopted.machine_id == host_id_of(ctx)
    # Adopted means owned: a rename afterwards still finds it by id.
    assert register_local_host(ctx, None, hostname="after-upgrade") == host.id
    assert [h.name for h in host_rows(ctx)] == ["after-upgrade"]
    assert gpus_on_offer(ctx) == 8


def test_a_legacy_row_of_another_name_is_not_adopted(ctx: Context) -> None:
    legacy = register(ctx, "00000000-0000-4000-8000-000000000001", "elsewhere")
    with ctx.transaction() as s:
        s.get_one(Host, legacy).machine_id = None
    [local, _] = host_rows(ctx)
    register_local_host(ctx, None, hostname=local.name)
    rows = {h.id: h for h in host_rows(ctx)}
    assert rows[legacy].machine_id is None and rows[legacy].name == "elsewhere"
    assert rows[local.id].machine_id == host_id_of(ctx)


def test_a_rename_onto_another_hosts_name_keeps_both_rows_apart(ctx: Context) -> None:
    other_id = "00000000-0000-4000-8000-000000000002"
    other = register(ctx, other_id, "gpu-box")
    [local, _] = host_rows(ctx)
    assert register_local_host(ctx, None, hostname="gpu-box") == local.id
    rows = {h.id: h for h in host_rows(ctx)}
    assert rows[other].name == "gpu-box" and rows[other].machine_id == other_id
    assert rows[local.id].name == f"gpu-box-{host_id_of(ctx)[:8]}"
    # The other machine registering again finds its own row, not ours.
    assert register(ctx, other_id, "gpu-box") == other
    assert len(host_rows(ctx)) == 2


def test_a_machine_without_gpus_says_how_to_declare_them(
    ctx: Context, caplog: pytest.LogCaptureFixture
) -> None:
    if discover_nvml_gpus():
        pytest.skip("this machine has GPUs NVML finds: the test is of one without (hardware)")
    bare = dataclasses.replace(ctx, settings=ctx.settings.model_copy(update={"local_gpus": None}))
    with caplog.at_level(logging.WARNING, logger="gpuyard.services.installation.bootstrap"):
        register_local_host(bare, None)  # no NVML here: no GPU found, none declared
    assert any("GPUYARD_LOCAL_GPUS" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="gpuyard.services.installation.bootstrap"):
        register_local_host(ctx, None)  # declared: nothing to say
    assert not any("GPUYARD_LOCAL_GPUS" in r.getMessage() for r in caplog.records)


def test_a_declared_local_cuda_version_is_kept(ctx: Context) -> None:
    # Declared GPUs: NVML is not asked; the setting is the version.
    declared = dataclasses.replace(
        ctx, settings=ctx.settings.model_copy(update={"local_cuda_version": "12.4"})
    )
    register_local_host(declared, None)
    assert [h.cuda_version for h in host_rows(ctx) if h.is_local] == ["12.4"]
    # A start that knows none keeps what was set (by the setting or PATCH /v1/hosts).
    register_local_host(ctx, None)
    assert [h.cuda_version for h in host_rows(ctx) if h.is_local] == ["12.4"]


def test_the_local_cuda_version_is_nvmls_where_it_sees_gpus(ctx: Context) -> None:
    found = discover_nvml_cuda()
    if found is None:
        pytest.skip("no NVML driver here: the discovered version is hardware's to test")
    assert cuda_version_key(found) is not None, found
    bare = dataclasses.replace(ctx, settings=ctx.settings.model_copy(update={"local_gpus": None}))
    register_local_host(bare, None)
    assert [h.cuda_version for h in host_rows(ctx) if h.is_local] == [found]
