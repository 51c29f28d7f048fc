"""Network volumes on a real database (SQLite and PostgreSQL) with the fake runtime:
create/list/get/grow/delete rules, placement on the volume's host, mounting by several
clusters, billing intervals, measured usage and the orphan collector."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest
from sqlalchemy import func, select, update

from gpuyard.core.errors import (
    InsufficientCapacity,
    NetworkVolumeInUse,
    NetworkVolumeNotFound,
    ValidationFailed,
)
from gpuyard.reconciler.loop import Reconciler
from gpuyard.runtimes.base import Runtime
from gpuyard.services.billing.metering import GroupBy, bill
from gpuyard.services.billing.storage import storage_rate_micro
from gpuyard.services.clock import FakeClock
from gpuyard.services.clusters import use_cases as uc
from gpuyard.services.clusters.moves import move_resting
from gpuyard.services.clusters.requests import CreateCluster, StartCluster
from gpuyard.services.context import Context
from gpuyard.services.tenancy.auth import Principal
from gpuyard.services.volumes import network_volumes as nvs
from gpuyard.store.schema import (
    Cluster,
    Host,
    NetworkVolume,
    OrphanVolume,
    Reservation,
    Snapshot,
    UsageInterval,
    VolumeMove,
)
from gpuyard.testing.fake_runtime import FakeRuntime
from tests.helpers import add_host_row


def new_volume(name: str = "data", size: int = 50, where: str = "local") -> nvs.CreateNetworkVolume:
    return nvs.CreateNetworkVolume.model_validate(
        {"name": name, "size": size, "dataCenterId": where}
    )


def mounting(volume_id: str, gpus: int = 1, **kw: object) -> CreateCluster:
    return CreateCluster.model_validate(
        {
            "gpu_type": "NVIDIA RTX A6000",
            "gpu_count": gpus,
            "docker_image": "img",
            "network_volume_id": volume_id,
            "volume_gb": 20,  # ignored: the network volume is mounted instead
            **kw,
        }
    )


def settle(rec: Reconciler, cluster_id: str) -> None:
    for _ in range(5):
        rec.driver.drive(cluster_id)


def status(ctx: Context, p: Principal, cid: str) -> str:
    return uc.get_cluster(ctx, p, cid).status


def runtime_of(runtime: Runtime) -> Callable[[int | None], Runtime]:
    return lambda _host_id: runtime


def reservation(ctx: Context, holder: str) -> Reservation | None:
    with ctx.read() as s:
        row = s.get(Reservation, holder)
        if row is not None:
            s.expunge(row)
        return row


def lab(ctx: Context, *names: str, disk_gb: int = 2000, gpus: int = 4) -> list[int]:
    """Hosts in location ``lab`` (the fixture's own machine is ``local``)."""
    return [add_host_row(ctx, n, gpus, location="lab", disk_gb=disk_gb) for n in names]


def test_create_list_get_rename_grow(ctx: Context, alice: Principal, bob: Principal) -> None:
    v = nvs.create_network_volume(ctx, alice, new_volume("data", 50))
    assert len(v.id) == 10 and v.size_gb == 50 and v.location == "local"
    assert v.project_id == alice.default_project_id and v.attached_cluster_ids == ()
    held = reservation(ctx, v.id)
    assert held is not None and held.host_id == v.host_id and held.volume_gb == 50
    assert held.vcpus == held.memory_gb == held.container_disk_gb == 0
    with ctx.read() as s:
        row = s.get(NetworkVolume, v.id)
        assert row is not None and row.volume_name == ctx.ownership.network_volume(v.id)
        assert row.volume_name.startswith(ctx.ownership.prefix + "-nv-")
    assert [x.id for x in nvs.list_network_volumes(ctx, alice)] == [v.id]
    assert nvs.get_network_volume(ctx, alice, v.id).name == "data"

    grown = nvs.update_network_volume(
        ctx, alice, v.id, nvs.UpdateNetworkVolume(name="renamed", size=80)
    )
    assert (grown.name, grown.size_gb) == ("renamed", 80)
    held = reservation(ctx, v.id)
    assert held is not None and held.volume_gb == 80
    same = nvs.update_network_volume(ctx, alice, v.id, nvs.UpdateNetworkVolume(size=80))
    assert same.size_gb == 80

    # Another account sees nothing and can touch nothing.
    assert nvs.list_network_volumes(ctx, bob) == []
    for call in (
        lambda: nvs.get_network_volume(ctx, bob, v.id),
        lambda: nvs.update_network_volume(ctx, bob, v.id, nvs.UpdateNetworkVolume(size=90)),
        lambda: nvs.delete_network_volume(ctx, bob, v.id, runtime_of(FakeRuntime())),
    ):
        with pytest.raises(NetworkVolumeNotFound):
            call()
    assert nvs.get_network_volume(ctx, alice, v.id).size_gb == 80


def test_size_only_grows(ctx: Context, alice: Principal) -> None:
    v = nvs.create_network_volume(ctx, alice, new_volume(size=50))
    with pytest.raises(ValidationFailed) as shrink:
        nvs.update_network_volume(ctx, alice, v.id, nvs.UpdateNetworkVolume(size=49))
    assert shrink.value.field == "size" and shrink.value.details["current_size"] == 50
    held = reservation(ctx, v.id)
    assert held is not None and held.volume_gb == 50


def test_unknown_data_centre_and_bounds_store_nothing(ctx: Context, alice: Principal) -> None:
    with pytest.raises(ValidationFailed) as unknown:
        nvs.create_network_volume(ctx, alice, new_volume(where="mars"))
    assert unknown.value.field == "dataCenterId" and "local" in unknown.value.details["locations"]
    for size in (0, nvs.MAX_SIZE_GB + 1):
        with pytest.raises(ValueError):
            new_volume(size=size)
    with ctx.read() as s:
        assert s.scalar(select(func.count()).select_from(NetworkVolume)) == 0
        assert s.scalar(select(func.count()).select_from(Reservation)) == 0


def test_disk_is_claimed_on_one_host_of_the_location(ctx: Context, alice: Principal) -> None:
    (small,) = lab(ctx, "small", disk_gb=100)
    first = nvs.create_network_volume(ctx, alice, new_volume("a", 80, "lab"))
    assert first.host_id == small
    with pytest.raises(InsufficientCapacity):
        nvs.create_network_volume(ctx, alice, new_volume("b", 30, "lab"))
    nvs.update_network_volume(ctx, alice, first.id, nvs.UpdateNetworkVolume(size=100))
    with pytest.raises(InsufficientCapacity):
        nvs.update_network_volume(ctx, alice, first.id, nvs.UpdateNetworkVolume(size=101))
    assert nvs.get_network_volume(ctx, alice, first.id).size_gb == 100
    with ctx.read() as s:
        assert s.scalar(select(func.count()).select_from(NetworkVolume)) == 1
    # A cluster's own volume competes for the same disk.
    with pytest.raises(InsufficientCapacity):
        uc.create_cluster(
            ctx,
            alice,
            CreateCluster.model_validate(
                {"docker_image": "img", "volume_gb": 1, "container_disk_gb": 1}
            ),
            location="lab",
        )


def test_clusters_mount_it_on_its_host_and_share_its_data(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime
) -> None:
    lab(ctx, "lab1", "lab2")
    v = nvs.create_network_volume(ctx, alice, new_volume("shared", 30, "lab"))
    a = uc.create_cluster(ctx, alice, mounting(v.id, volume_mount_path="/data"))
    b = uc.create_cluster(ctx, alice, mounting(v.id, gpus=2))
    for c in (a, b):
        assert c.host_id == v.host_id and c.network_volume_id == v.id
        assert c.volume_gb == 0  # none of its own, and none reserved or billed
        held = reservation(ctx, c.id)
        assert held is not None and held.volume_gb == 0
        settle(rec, c.id)
        assert status(ctx, alice, c.id) == "running"
    name = ctx.ownership.network_volume(v.id)
    assert runtime.containers[a.id].spec.volume_name == name
    assert runtime.containers[a.id].spec.volume_mount_path == "/data"
    assert runtime.containers[b.id].spec.volume_name == name
    # Made once, labelled for the volume (not for the first cluster that mounted it).
    assert runtime.volumes[name].cluster_id == v.id
    assert set(nvs.get_network_volume(ctx, alice, v.id).attached_cluster_ids) == {a.id, b.id}

    runtime.write_file(a.id, "/data/model.bin", "weights")
    assert runtime.volume_files(name) == {"model.bin": "weights"}

    for c in (a, b):
        uc.terminate_cluster(ctx, alice, c.id)
        settle(rec, c.id)
        assert status(ctx, alice, c.id) == "terminated"
    assert runtime.volume_files(name) == {"model.bin": "weights"}  # it outlives them
    held = reservation(ctx, v.id)
    assert held is not None and held.volume_gb == 30
    rec.scan_volumes()  # known to the store: never quarantined
    with ctx.read() as s:
        assert s.scalar(select(func.count()).select_from(OrphanVolume)) == 0

    c = uc.create_cluster(ctx, alice, mounting(v.id))
    settle(rec, c.id)
    runtime.write_file(c.id, "/workspace/more.txt", "x")
    assert runtime.volume_files(name) == {"model.bin": "weights", "more.txt": "x"}


def test_unknown_or_foreign_volume_stores_no_cluster(
    ctx: Context, alice: Principal, bob: Principal
) -> None:
    theirs = nvs.create_network_volume(ctx, bob, new_volume())
    for volume_id in ("nope123456", theirs.id):
        with pytest.raises(NetworkVolumeNotFound) as missing:
            uc.create_cluster(ctx, alice, mounting(volume_id))
        assert missing.value.details == {"network_volume_id": volume_id}
    with ctx.read() as s:
        assert s.scalar(select(func.count()).select_from(Cluster)) == 0


def test_a_pinned_location_elsewhere_and_a_clone_are_refused(
    ctx: Context, alice: Principal
) -> None:
    lab(ctx, "lab1")
    v = nvs.create_network_volume(ctx, alice, new_volume(where="lab"))
    with pytest.raises(ValidationFailed) as elsewhere:
        uc.create_cluster(ctx, alice, mounting(v.id), location="local")
    assert elsewhere.value.field == "location"
    assert uc.create_cluster(ctx, alice, mounting(v.id), location="lab").host_id == v.host_id


def test_delete_is_refused_while_mounted_or_snapshotted(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime
) -> None:
    v = nvs.create_network_volume(ctx, alice, new_volume())
    c = uc.create_cluster(ctx, alice, mounting(v.id))
    settle(rec, c.id)
    uc.stop_cluster(ctx, alice, c.id)
    settle(rec, c.id)
    assert status(ctx, alice, c.id) == "stopped"
    with pytest.raises(NetworkVolumeInUse) as in_use:
        nvs.delete_network_volume(ctx, alice, v.id, runtime_of(runtime))
    assert in_use.value.details == {"cluster_ids": [c.id], "snapshot_ids": []}
    assert c.id in in_use.value.message

    uc.terminate_cluster(ctx, alice, c.id)
    settle(rec, c.id)
    with ctx.transaction() as s:
        s.add(
            Snapshot(
                id="snap_abcdefghi",
                account_id=alice.account_id,
                project_id=alice.default_project_id,
                name="before",
                description="",
                source_network_volume_id=v.id,
                host_id=v.host_id,
                volume_name=ctx.ownership.network_volume(v.id),
                volume_gb=v.size_gb,
                status="ready",
                consistency="stopped",
                created_at=ctx.clock.now(),
            )
        )
    with pytest.raises(NetworkVolumeInUse) as snapped:
        nvs.delete_network_volume(ctx, alice, v.id, runtime_of(runtime))
    assert snapped.value.details == {"cluster_ids": [], "snapshot_ids": ["snap_abcdefghi"]}

    with ctx.transaction() as s:
        s.execute(update(Snapshot).values(deleted_at=ctx.clock.now()))
    name = ctx.ownership.network_volume(v.id)
    assert name in runtime.volumes
    nvs.delete_network_volume(ctx, alice, v.id, runtime_of(runtime))
    assert name not in runtime.volumes
    assert reservation(ctx, v.id) is None
    with pytest.raises(NetworkVolumeNotFound):
        nvs.get_network_volume(ctx, alice, v.id)
    with pytest.raises(NetworkVolumeNotFound):
        nvs.delete_network_volume(ctx, alice, v.id, runtime_of(runtime))
    with pytest.raises(NetworkVolumeNotFound):
        uc.create_cluster(ctx, alice, mounting(v.id))
    assert nvs.list_network_volumes(ctx, alice) == []
    with ctx.read() as s:
        row = s.get(NetworkVolume, v.id)
        assert row is not None and row.deleted_at is not None  # kept for billing history


def test_a_delete_the_engine_refuses_is_finished_by_the_reconciler(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime
) -> None:
    v = nvs.create_network_volume(ctx, alice, new_volume())
    c = uc.create_cluster(ctx, alice, mounting(v.id))
    settle(rec, c.id)
    uc.terminate_cluster(ctx, alice, c.id)
    settle(rec, c.id)
    name = ctx.ownership.network_volume(v.id)
    runtime.fail_next["remove_volume"] = "engine restarting"
    nvs.delete_network_volume(ctx, alice, v.id, runtime_of(runtime))
    # Deleted for the API and billing; the engine volume and its disk are still held,
    # and the orphan collector leaves it to this removal.
    assert nvs.list_network_volumes(ctx, alice) == []
    assert name in runtime.volumes and reservation(ctx, v.id) is not None
    rec.scan_volumes()
    with ctx.read() as s:
        assert s.scalar(select(func.count()).select_from(OrphanVolume)) == 0
    rec.volume_usage.run(runtime, ())
    assert name not in runtime.volumes and reservation(ctx, v.id) is None


def test_a_stopped_cluster_starts_only_on_the_volumes_host(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime
) -> None:
    one_gpu, _roomy = lab(ctx, "one-gpu", gpus=1), lab(ctx, "roomy")
    v = nvs.create_network_volume(ctx, alice, new_volume(where="lab"))
    assert v.host_id == one_gpu[0]  # binpack: the fuller host
    a = uc.create_cluster(ctx, alice, mounting(v.id))
    settle(rec, a.id)
    uc.stop_cluster(ctx, alice, a.id)
    settle(rec, a.id)
    b = uc.create_cluster(ctx, alice, mounting(v.id))  # takes the host's only GPU
    assert b.host_id == v.host_id
    with pytest.raises(InsufficientCapacity):
        uc.start_cluster(ctx, alice, a.id, StartCluster())
    with ctx.read() as s:
        stopped = s.get(Cluster, a.id)
        assert stopped is not None and stopped.status == "stopped"
        assert stopped.host_id == v.host_id
        assert s.get(VolumeMove, a.id) is None
    # A drain cannot send it away either; its own volume cannot be grown.
    assert "network volume" in (move_resting(ctx, a.id, "draining host", ctx.clock.now()) or "")
    body = StartCluster.model_validate({"update_configuration": {"storage_gb": 10}})
    with pytest.raises(ValidationFailed) as grow:
        uc.start_cluster(ctx, alice, a.id, body)
    assert grow.value.field == "update_configuration.storage_gb"


def test_billed_by_size_from_create_to_delete(
    ctx: Context, alice: Principal, clock: FakeClock, runtime: FakeRuntime
) -> None:
    start = clock.now()
    v = nvs.create_network_volume(ctx, alice, new_volume("billed", 10))
    clock.advance(3600)
    nvs.update_network_volume(ctx, alice, v.id, nvs.UpdateNetworkVolume(size=20))
    clock.advance(1800)
    nvs.delete_network_volume(ctx, alice, v.id, runtime_of(runtime))
    price = ctx.settings.price_network_volume_gb_month
    rates = (storage_rate_micro(10, price), storage_rate_micro(20, price))
    with ctx.read() as s:
        rows = list(
            s.scalars(
                select(UsageInterval)
                .where(UsageInterval.cluster_id == v.id)
                .order_by(UsageInterval.started_at)
            )
        )
        assert [(r.meter, r.rate_micro, r.project_id) for r in rows] == [
            ("network_volume", rates[0], v.project_id),
            ("network_volume", rates[1], v.project_id),
        ]
        assert rows[0].started_at == start and rows[0].ended_at == start + timedelta(hours=1)
        assert rows[1].ended_at == start + timedelta(hours=1.5)
        clock.advance(3600)  # nothing accrues after the delete
        billed = bill(
            s,
            alice.account_id,
            None,
            start,
            clock.now(),
            GroupBy.CLUSTER,
            clock.now(),
        )
    (line,) = billed.lines
    assert (line.key, line.label) == (v.id, "billed")
    expected = (rates[0] * 3600 + rates[1] * 1800) // 3600
    assert line.meters_micro()["network_volume"] == expected == billed.total_micro
    # 10 GB at 0.07 USD per GB-month for an hour, 20 GB for half an hour.
    assert rates[0] == round(10 * price / 730 * 1e6)


def test_a_mounting_cluster_bills_no_volume_of_its_own(
    ctx: Context, alice: Principal, rec: Reconciler
) -> None:
    v = nvs.create_network_volume(ctx, alice, new_volume())
    c = uc.create_cluster(ctx, alice, mounting(v.id))
    settle(rec, c.id)
    with ctx.read() as s:
        meters = set(s.scalars(select(UsageInterval.meter).where(UsageInterval.cluster_id == c.id)))
    assert "volume" not in meters and "gpu" in meters


def test_usage_is_measured_per_host(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime, clock: FakeClock
) -> None:
    v = nvs.create_network_volume(ctx, alice, new_volume())
    mounts = uc.create_cluster(ctx, alice, mounting(v.id))
    own = uc.create_cluster(
        ctx, alice, CreateCluster.model_validate({"docker_image": "img", "volume_gb": 5})
    )
    bare = uc.create_cluster(ctx, alice, CreateCluster.model_validate({"docker_image": "img"}))
    for c in (mounts, own, bare):
        settle(rec, c.id)
    runtime.write_file(mounts.id, "/workspace/a", "12345")
    runtime.write_file(own.id, "/workspace/b", "123")
    rec.volume_usage.run(runtime, ())
    with ctx.read() as s:
        by_id = {c.id: c for c in s.scalars(select(Cluster))}
        volume = s.get(NetworkVolume, v.id)
    assert by_id[mounts.id].volume_used_bytes == 5
    assert by_id[own.id].volume_used_bytes == 3
    assert by_id[own.id].volume_measured_at == clock.now()
    assert by_id[bare.id].volume_used_bytes is None
    assert volume is not None and volume.used_bytes == 5 and volume.measured_at == clock.now()
    assert nvs.get_network_volume(ctx, alice, v.id).used_bytes == 5
    # An observation: no version, no updated_at change.
    assert by_id[own.id].version == uc.get_cluster(ctx, alice, own.id).version
    # Only the engine of the given hosts: another host's rows are left alone.
    other = add_host_row(ctx, "elsewhere")
    with ctx.transaction() as s:
        s.execute(update(Host).where(Host.id == other).values(location="else"))
    runtime.write_file(own.id, "/workspace/b", "123456")
    rec.volume_usage.run(runtime, (other,))
    assert uc.get_cluster(ctx, alice, own.id).volume_used_bytes == 3


def test_usage_pass_is_due_once_per_interval(ctx: Context) -> None:
    from gpuyard.reconciler.duties.volume_usage import VolumeUsage

    duty = VolumeUsage(ctx)
    assert duty.due("a") and not duty.due("a") and duty.due("b")
