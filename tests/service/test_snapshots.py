"""Snapshots on a real database (SQLite and PostgreSQL) and the real restic repository,
with the in-memory engine: take, restore on start, clone, snapshot before changes,
failures that change nothing, deletion, billing."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select

from gpuyard.api.rest.schemas.cluster_json import cluster_v1
from gpuyard.core.errors import (
    InvalidState,
    NetworkVolumeInUse,
    SnapshotNotFound,
    SnapshotNotReady,
    ValidationFailed,
)
from gpuyard.reconciler.clusters.snapshots import snapshot_tag
from gpuyard.reconciler.loop import Reconciler
from gpuyard.services.billing.metering import GroupBy, bill
from gpuyard.services.clusters import use_cases as uc
from gpuyard.services.clusters import views as cluster_views
from gpuyard.services.clusters.requests import StartCluster
from gpuyard.services.context import Context
from gpuyard.services.tenancy.auth import Principal
from gpuyard.services.volumes import network_volumes as nvs
from gpuyard.services.volumes import snapshots as svc
from gpuyard.store.schema import (
    Cluster,
    NetworkVolume,
    Snapshot,
    UsageInterval,
    VolumeRestore,
)
from gpuyard.testing.fake_runtime import FakeRuntime
from tests.required_parts import needs_tools
from tests.service.test_lifecycle import a6000, settle

pytestmark = needs_tools("restic", how="apt-get install restic")

FILES = {"data/model.bin": "weights" * 1000, "notes.txt": "hello", "deep/a/b/c.txt": "c"}


def running_with_files(
    ctx: Context, p: Principal, rec: Reconciler, runtime: FakeRuntime
) -> Cluster:
    c = uc.create_cluster(ctx, p, a6000(1, volume_gb=5))
    settle(rec, c.id)
    for name, content in FILES.items():
        runtime.write_file(c.id, f"/workspace/{name}", content)
    return uc.get_cluster(ctx, p, c.id)


def volume_files(ctx: Context, runtime: FakeRuntime, cluster_id: str) -> dict[str, str]:
    with ctx.read() as s:
        c = s.get(Cluster, cluster_id)
        assert c is not None
        name = c.volume_name or ctx.ownership.volume(c.id)
    return runtime.volume_files(name)


def stopped(ctx: Context, p: Principal, rec: Reconciler, cluster_id: str) -> None:
    uc.stop_cluster(ctx, p, cluster_id)
    settle(rec, cluster_id)
    assert uc.get_cluster(ctx, p, cluster_id).status == "stopped"


def test_snapshot_of_a_running_cluster_is_crash_consistent_and_billed(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime
) -> None:
    # The ledger counts whole micro-dollars an hour: a price that bills a few KB.
    ctx.settings.price_snapshot_gb_month = 1_000_000.0
    c = running_with_files(ctx, alice, rec, runtime)
    snap = svc.create_snapshot(ctx, alice, c.id, "first", "before training")
    assert snap.id.startswith("snap_") and len(snap.id) == 14
    assert snap.status == "creating" and snap.consistency == "crash_consistent"
    rec.snapshots.take(snap.id)
    done = svc.get_snapshot(ctx, alice, snap.id)
    assert done.status == "ready", done.error
    assert done.file_count == len(FILES)  # the in-memory engine keeps no directories
    assert done.size_bytes == sum(len(v) for v in FILES.values())
    assert done.stored_bytes is not None and done.stored_bytes > 0
    assert done.ready_at is not None and done.restic_id
    with ctx.read() as s:
        meters = s.scalars(
            select(UsageInterval.meter).where(
                UsageInterval.cluster_id == snap.id, UsageInterval.ended_at.is_(None)
            )
        ).all()
    assert meters == ["snapshot"]
    rows, total = svc.list_snapshots(ctx, alice, cluster_id=c.id)
    assert total == 1 and rows[0].id == snap.id


def test_restore_on_start_replaces_the_volume_and_says_so(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime
) -> None:
    c = running_with_files(ctx, alice, rec, runtime)
    snap = svc.create_snapshot(ctx, alice, c.id, "", "")
    rec.snapshots.take(snap.id)
    stopped(ctx, alice, rec, c.id)
    old_volume = ctx.ownership.volume(c.id)
    runtime.replace_volume_files(old_volume, {"notes.txt": "changed", "new.txt": "x"})

    result = uc.start_cluster(ctx, alice, c.id, StartCluster(restore_from_snapshot=snap.id))
    assert f"restore_from_snapshot: {snap.id} ({snap.name})" in (
        result.configuration_updates_applied
    )
    d = cluster_views.load_visible(ctx, alice.account_id, c.id)
    progress = cluster_v1(d)["startup_progress"]
    assert progress["restoring_snapshot"]["snapshot_id"] == snap.id
    settle(rec, c.id)
    after = uc.get_cluster(ctx, alice, c.id)
    assert after.status == "running"
    assert after.volume_name is not None and after.volume_name != old_volume
    assert volume_files(ctx, runtime, c.id) == FILES
    assert old_volume not in runtime.volumes  # the replaced volume is gone


def test_clone_starts_with_the_snapshot(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime
) -> None:
    c = running_with_files(ctx, alice, rec, runtime)
    snap = svc.create_snapshot(ctx, alice, c.id, "", "")
    rec.snapshots.take(snap.id)
    clone = uc.create_cluster(ctx, alice, a6000(1, snapshot_id=snap.id))
    assert clone.volume_gb == 5  # at least the source's volume
    settle(rec, clone.id)
    assert uc.get_cluster(ctx, alice, clone.id).status == "running"
    assert volume_files(ctx, runtime, clone.id) == FILES
    # The restored volume is held to the clone's size (made sized, not grown later).
    with ctx.read() as s:
        row = s.get(Cluster, clone.id)
        assert row is not None and row.volume_name is not None
    assert runtime.volumes[row.volume_name].size_gb == 5


def test_foreign_unknown_and_unready_snapshots_change_nothing(
    ctx: Context, alice: Principal, bob: Principal, rec: Reconciler, runtime: FakeRuntime
) -> None:
    c = running_with_files(ctx, alice, rec, runtime)
    snap = svc.create_snapshot(ctx, alice, c.id, "", "")
    with pytest.raises(SnapshotNotFound):
        svc.get_snapshot(ctx, bob, snap.id)
    with pytest.raises(InvalidState):
        uc.start_cluster(ctx, alice, c.id, StartCluster(restore_from_snapshot=snap.id))
    stopped(ctx, alice, rec, c.id)
    with pytest.raises(SnapshotNotReady):  # still creating
        uc.start_cluster(ctx, alice, c.id, StartCluster(restore_from_snapshot=snap.id))
    rec.snapshots.take(snap.id)
    bobs = uc.create_cluster(ctx, bob, a6000(1, volume_gb=5))
    settle(rec, bobs.id)
    stopped(ctx, bob, rec, bobs.id)
    for who, cid, sid in ((bob, bobs.id, snap.id), (alice, c.id, "snap_nothere00")):
        with pytest.raises(SnapshotNotFound):
            uc.start_cluster(ctx, who, cid, StartCluster(restore_from_snapshot=sid))
        assert uc.get_cluster(ctx, who, cid).status == "stopped"
    with pytest.raises(SnapshotNotFound):
        uc.create_cluster(ctx, bob, a6000(1, snapshot_id=snap.id))
    with ctx.read() as s:
        assert s.scalars(select(VolumeRestore)).all() == []


def test_a_failed_restore_leaves_the_volume_as_it_was(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime
) -> None:
    c = running_with_files(ctx, alice, rec, runtime)
    snap = svc.create_snapshot(ctx, alice, c.id, "", "")
    rec.snapshots.take(snap.id)
    stopped(ctx, alice, rec, c.id)
    uc.start_cluster(ctx, alice, c.id, StartCluster(restore_from_snapshot=snap.id))
    # The data goes missing from the repository behind the snapshot's back.
    rec.snapshots.repositories.for_account(alice.account_id).forget(
        [svc.get_snapshot(ctx, alice, snap.id).restic_id or ""]
    )
    settle(rec, c.id)
    after = uc.get_cluster(ctx, alice, c.id)
    assert after.status == "error"
    assert after.error_message and "the volume is as it was" in after.error_message
    assert after.volume_name is None
    assert volume_files(ctx, runtime, c.id) == FILES
    with ctx.read() as s:
        restore = s.scalars(select(VolumeRestore)).one()
    assert restore.status == "failed"
    assert restore.target_volume not in runtime.volumes


def test_snapshot_before_changes_is_taken_before_the_restore(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime
) -> None:
    c = running_with_files(ctx, alice, rec, runtime)
    first = svc.create_snapshot(ctx, alice, c.id, "", "")
    rec.snapshots.take(first.id)
    stopped(ctx, alice, rec, c.id)
    runtime.replace_volume_files(ctx.ownership.volume(c.id), {"later.txt": "work"})
    result = uc.start_cluster(
        ctx, alice, c.id, StartCluster(restore_from_snapshot=first.id, snapshot_before_changes=True)
    )
    before = result.snapshot_before_changes
    assert before is not None and before.consistency == "stopped"
    settle(rec, c.id)  # waits for the snapshot of the resting volume
    assert uc.get_cluster(ctx, alice, c.id).status == "starting"
    rec.snapshots.take(before.id)
    settle(rec, c.id)
    assert uc.get_cluster(ctx, alice, c.id).status == "running"
    assert volume_files(ctx, runtime, c.id) == FILES
    # The snapshot taken first holds the volume as it was: restore it into a clone.
    clone = uc.create_cluster(ctx, alice, a6000(1, snapshot_id=before.id))
    settle(rec, clone.id)
    assert volume_files(ctx, runtime, clone.id) == {"later.txt": "work"}


def test_an_interrupted_snapshot_fails_and_leaves_nothing(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime
) -> None:
    c = running_with_files(ctx, alice, rec, runtime)
    snap = svc.create_snapshot(ctx, alice, c.id, "", "")
    with ctx.transaction() as s:
        row = s.get(Snapshot, snap.id)
        assert row is not None
        row.worker = "a-server-that-died"
    rec.snapshots.take(snap.id)
    failed = svc.get_snapshot(ctx, alice, snap.id)
    assert failed.status == "failed" and failed.error and "interrupted" in failed.error
    assert (
        rec.snapshots.repositories.for_account(alice.account_id).find_by_tag(snapshot_tag(snap.id))
        == []
    )


def test_a_snapshot_of_a_missing_volume_fails_with_the_reason(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime
) -> None:
    c = running_with_files(ctx, alice, rec, runtime)
    snap = svc.create_snapshot(ctx, alice, c.id, "", "")
    runtime.unavailable = "engine gone"
    rec.snapshots.take(snap.id)
    failed = svc.get_snapshot(ctx, alice, snap.id)
    assert failed.status == "failed" and failed.error and "engine gone" in failed.error


def test_delete_stops_billing_and_forgets_the_data(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime
) -> None:
    ctx.settings.price_snapshot_gb_month = 1_000_000.0
    c = running_with_files(ctx, alice, rec, runtime)
    snap = svc.create_snapshot(ctx, alice, c.id, "", "")
    with pytest.raises(InvalidState):  # still being taken
        svc.delete_snapshot(ctx, alice, snap.id)
    rec.snapshots.take(snap.id)
    svc.delete_snapshot(ctx, alice, snap.id)
    with pytest.raises(SnapshotNotFound):
        svc.get_snapshot(ctx, alice, snap.id)
    with ctx.read() as s:
        open_ = s.scalars(
            select(UsageInterval).where(
                UsageInterval.cluster_id == snap.id, UsageInterval.ended_at.is_(None)
            )
        ).all()
        billed = s.scalars(select(UsageInterval).where(UsageInterval.cluster_id == snap.id)).all()
    assert open_ == [] and len(billed) <= 1  # closed (or dropped: it lasted no second)
    assert rec.snapshots.repositories.for_account(alice.account_id).find_by_tag(
        snapshot_tag(snap.id)
    )
    rec.snapshots.forget_unwanted()
    assert (
        rec.snapshots.repositories.for_account(alice.account_id).find_by_tag(snapshot_tag(snap.id))
        == []
    )
    with ctx.read() as s:
        row = s.get(Snapshot, snap.id)
        assert row is not None and row.restic_id is None


def test_cannot_snapshot_without_a_volume_or_while_terminating(
    ctx: Context, alice: Principal, rec: Reconciler
) -> None:
    c = uc.create_cluster(ctx, alice, a6000(1))
    settle(rec, c.id)
    with pytest.raises(InvalidState):
        svc.create_snapshot(ctx, alice, c.id, "", "")
    uc.terminate_cluster(ctx, alice, c.id)
    with pytest.raises(InvalidState):
        svc.create_snapshot(ctx, alice, c.id, "", "")


def test_network_volume_snapshot_restore_and_bill(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime
) -> None:
    ctx.settings.price_snapshot_gb_month = 1_000_000.0
    volume = nvs.create_network_volume(
        ctx,
        alice,
        nvs.CreateNetworkVolume.model_validate({"name": "d", "size": 10, "dataCenterId": "local"}),
    )
    c = uc.create_cluster(
        ctx, alice, a6000(1, network_volume_id=volume.id, volume_mount_path="/data")
    )
    settle(rec, c.id)
    runtime.write_file(c.id, "/data/shared.txt", "v1")
    # A snapshot through the cluster is of the network volume it mounts.
    snap = svc.create_snapshot(ctx, alice, c.id, "nv", "")
    assert snap.source_network_volume_id == volume.id and snap.source_cluster_id == c.id
    rec.snapshots.take(snap.id)
    assert svc.get_snapshot(ctx, alice, snap.id).status == "ready"
    direct = svc.create_volume_snapshot(ctx, alice, volume.id, "direct", "")
    assert direct.consistency == "crash_consistent" and direct.source_cluster_id is None
    rec.snapshots.take(direct.id)

    # A cluster mounting it cannot restore through its start; the volume itself can,
    # once nothing that mounts it runs.
    runtime.write_file(c.id, "/data/shared.txt", "v2")
    with pytest.raises(InvalidState):
        svc.restore_volume_of_network_volume(ctx, alice, volume.id, snap.id)
    stopped(ctx, alice, rec, c.id)
    with pytest.raises(InvalidState):
        uc.start_cluster(ctx, alice, c.id, StartCluster(restore_from_snapshot=snap.id))
    with pytest.raises(ValidationFailed):  # a clone has no volume of its own to go to
        uc.create_cluster(ctx, alice, a6000(1, network_volume_id=volume.id, snapshot_id=snap.id))
    restore = svc.restore_volume_of_network_volume(ctx, alice, volume.id, snap.id)
    assert restore.status == "restoring"
    with pytest.raises(InvalidState):  # nothing mounts it until the restore is done
        uc.start_cluster(ctx, alice, c.id, StartCluster())
    rec.snapshots.restore_network_volume(volume.id)
    with ctx.read() as s:
        row = s.get(NetworkVolume, volume.id)
        assert row is not None
        name = row.volume_name
    assert name != ctx.ownership.network_volume(volume.id)
    assert runtime.volume_files(name) == {"shared.txt": "v1"}
    uc.start_cluster(ctx, alice, c.id, StartCluster())
    settle(rec, c.id)
    assert uc.get_cluster(ctx, alice, c.id).status == "running"

    # Snapshots keep the network volume from being deleted, and are billed by name.
    with pytest.raises(NetworkVolumeInUse):
        nvs.delete_network_volume(ctx, alice, volume.id, rec.fleet.for_host)
    with ctx.read() as s:
        lines = bill(
            s,
            alice.account_id,
            None,
            snap.created_at,
            ctx.clock.now() + timedelta(hours=1),
            GroupBy.CLUSTER,
            ctx.clock.now() + timedelta(hours=1),
        ).lines
    names = {line.key: line.label for line in lines}
    assert names.get(snap.id) == "nv"


def test_a_stop_calls_off_a_restore_and_frees_the_snapshot(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime
) -> None:
    c = running_with_files(ctx, alice, rec, runtime)
    snap = svc.create_snapshot(ctx, alice, c.id, "", "")
    rec.snapshots.take(snap.id)
    stopped(ctx, alice, rec, c.id)
    uc.start_cluster(ctx, alice, c.id, StartCluster(restore_from_snapshot=snap.id))
    uc.stop_cluster(ctx, alice, c.id)  # before the restore ran
    settle(rec, c.id)
    with ctx.read() as s:
        restore = s.scalars(select(VolumeRestore)).one()
    assert restore.status == "failed" and restore.error and "called off" in restore.error
    assert volume_files(ctx, runtime, c.id) == FILES
    # Nothing holds the snapshot or the volume any more.
    svc.create_snapshot(ctx, alice, c.id, "", "")
    svc.delete_snapshot(ctx, alice, snap.id)
    uc.start_cluster(ctx, alice, c.id, StartCluster())
    settle(rec, c.id)
    assert volume_files(ctx, runtime, c.id) == FILES  # the abandoned restore stays undone


def test_one_snapshot_of_a_volume_at_a_time_and_starts_wait_for_it(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime
) -> None:
    c = running_with_files(ctx, alice, rec, runtime)
    first = svc.create_snapshot(ctx, alice, c.id, "", "")
    with pytest.raises(InvalidState) as refused:
        svc.create_snapshot(ctx, alice, c.id, "", "")
    assert refused.value.details["snapshot_id"] == first.id
    # A stop and a start while it is read: the start waits until it is done.
    uc.stop_cluster(ctx, alice, c.id)
    settle(rec, c.id)
    uc.start_cluster(ctx, alice, c.id, StartCluster())
    settle(rec, c.id)
    assert uc.get_cluster(ctx, alice, c.id).status == "starting"
    rec.snapshots.take(first.id)
    settle(rec, c.id)
    assert uc.get_cluster(ctx, alice, c.id).status == "running"
    assert svc.get_snapshot(ctx, alice, first.id).status == "ready"
