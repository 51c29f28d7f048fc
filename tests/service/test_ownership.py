"""Two installations share one (fake) engine: each sees, recovers and collects only its
own objects; unknown containers of ours go after a grace period; unknown volumes of
ours are quarantined, never deleted on sight."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select, update

from gpuyard.reconciler.duties.orphans import delete_quarantined
from gpuyard.reconciler.loop import Reconciler
from gpuyard.reconciler.wiring import build_reconciler
from gpuyard.runtimes.base import ContainerSpec, ContainerState
from gpuyard.services.clock import FakeClock
from gpuyard.services.clusters import use_cases as uc
from gpuyard.services.context import Context
from gpuyard.services.installation.bootstrap import first_start, open_store, register_local_host
from gpuyard.services.tenancy.auth import Principal
from gpuyard.store.schema import Event, Installation, OrphanVolume
from gpuyard.testing.fake_runtime import FakeRuntime
from tests.conftest import new_principal
from tests.helpers import make_settings
from tests.service.test_lifecycle import a6000, settle


@pytest.fixture
def other(tmp_path: Path, clock: FakeClock) -> Iterator[Context]:
    """A second installation (its own home and SQLite store) on the same machine."""
    settings = make_settings(tmp_path / "other-home", f"sqlite:///{tmp_path / 'other.db'}")
    engine, sessions = open_store(settings)
    context = Context(sessions=sessions, settings=settings, clock=clock)
    first_start(context)
    register_local_host(context, None)
    yield context
    engine.dispose()


def _spec(cluster_id: str, volume: str | None) -> ContainerSpec:
    return ContainerSpec(
        cluster_id=cluster_id,
        image="img",
        command=None,
        env={},
        ports=(),
        volume_name=volume,
        volume_mount_path="/workspace",
        cpu_cores=1,
        memory_gb=1,
        gpu_indices=(),
    )


def _orphans(ctx: Context) -> list[OrphanVolume]:
    with ctx.read() as s:
        rows = list(s.scalars(select(OrphanVolume).order_by(OrphanVolume.id)))
        s.expunge_all()
        return rows


def test_two_installations_never_touch_each_other(
    ctx: Context,
    other: Context,
    alice: Principal,
    rec: Reconciler,
    runtime: FakeRuntime,
    clock: FakeClock,
) -> None:
    assert ctx.ownership != other.ownership
    other_rt = runtime.sharing_engine()
    other_rec = build_reconciler(other, other_rt)
    carol = new_principal(other, "carol@example.com")
    mine = uc.create_cluster(ctx, alice, a6000(1, volume_gb=5))
    theirs = uc.create_cluster(other, carol, a6000(1, volume_gb=5))
    settle(rec, mine.id)
    settle(other_rec, theirs.id)
    # A container and a volume nobody labelled (a developer's own): never touched.
    runtime.containers["devcontainer01"] = runtime.containers[mine.id].__class__(
        id="dev", spec=_spec("devcontainer01", "dev-volume"), owner=None
    )
    runtime.volumes["dev-volume"] = runtime.volumes[ctx.ownership.volume(mine.id)].__class__(
        "dev-volume", owner=None
    )
    for _ in range(3):
        clock.advance(600)
        for r in (rec, other_rec):
            r.observe()
            r.scan_volumes()
            r.wait_idle(timeout=10)
    assert {mine.id, theirs.id, "devcontainer01"} <= set(runtime.containers)
    assert all(runtime.containers[c].state == ContainerState.RUNNING for c in (mine.id, theirs.id))
    assert _orphans(ctx) == [] and _orphans(other) == []
    # Terminating in one leaves the other's container and volume alone.
    uc.terminate_cluster(ctx, alice, mine.id)
    settle(rec, mine.id)
    assert mine.id not in runtime.containers
    assert theirs.id in runtime.containers
    assert other.ownership.volume(theirs.id) in runtime.volumes
    assert "dev-volume" in runtime.volumes
    rec.stop()
    other_rec.stop()


def test_unknown_container_of_ours_is_stopped_and_kept_only_after_the_grace(
    ctx: Context, rec: Reconciler, runtime: FakeRuntime, clock: FakeClock
) -> None:
    # A cluster the database has never known (made after the backup it was restored
    # from) is quarantined: stopped so its GPUs are not used twice, never removed.
    runtime.ensure_image("img")
    runtime.create(_spec("zzzzzzzzzzzzzz", None))
    runtime.start("zzzzzzzzzzzzzz")
    rec.observe()
    rec.wait_idle(timeout=10)
    clock.advance(ctx.settings.orphan_container_grace_s - 1)
    rec.observe()
    rec.wait_idle(timeout=10)
    assert runtime.containers["zzzzzzzzzzzzzz"].state == ContainerState.RUNNING
    clock.advance(2)
    for _ in range(3):  # stopped once, then left alone
        rec.observe()
        rec.wait_idle(timeout=10)
    rec.stop()
    assert runtime.containers["zzzzzzzzzzzzzz"].state == ContainerState.EXITED
    with ctx.read() as s:
        events = list(s.scalars(select(Event).where(Event.cluster_id == "zzzzzzzzzzzzzz")))
    assert [e.type for e in events] == ["quarantined"]
    assert "no cluster in the database knows" in events[0].message


def test_unknown_volume_is_quarantined_then_deleted_after_retention(
    ctx: Context, rec: Reconciler, runtime: FakeRuntime, clock: FakeClock
) -> None:
    lost = ctx.ownership.volume("lostcluster001")
    runtime.ensure_volume(lost, "lostcluster001")
    runtime.volumes[lost].files["data"] = "x" * 100
    rec.scan_volumes()
    rows = _orphans(ctx)
    assert [(r.name, r.size_bytes, r.deleted_at) for r in rows] == [(lost, 100, None)]
    assert lost in runtime.volumes
    clock.advance(ctx.settings.orphan_volume_retention_hours * 3600 - 10)
    rec.scan_volumes()
    assert lost in runtime.volumes
    clock.advance(20)
    rec.scan_volumes()
    assert lost not in runtime.volumes
    (row,) = _orphans(ctx)
    assert row.outcome == "deleted" and row.deleted_at is not None


def test_quarantined_volume_known_again_is_released_not_deleted(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime, clock: FakeClock
) -> None:
    c = uc.create_cluster(ctx, alice, a6000(1, volume_gb=5))
    settle(rec, c.id)
    volume = ctx.ownership.volume(c.id)
    # The store forgets the cluster (an older backup restored), then learns it again.
    with ctx.transaction() as s:
        row = s.get(type(uc.get_cluster(ctx, alice, c.id)), c.id)
        assert row is not None
        row.status = "terminated"
    rec.scan_volumes()
    assert [r.name for r in _orphans(ctx)] == [volume]
    with ctx.transaction() as s:
        row = s.get(type(uc.get_cluster(ctx, alice, c.id)), c.id)
        assert row is not None
        row.status = "running"
    assert not delete_quarantined(ctx, runtime, _orphans(ctx)[0], "admin")
    assert volume in runtime.volumes
    (released,) = _orphans(ctx)
    assert released.outcome == "released"


def test_after_a_restore_older_unknown_volumes_are_kept_until_an_admin_deletes_them(
    ctx: Context, rec: Reconciler, runtime: FakeRuntime, clock: FakeClock
) -> None:
    # A volume made after the backup this installation was restored from: the
    # retention never deletes it (the fake engine does not say when a volume was made,
    # which counts as older than the restore).
    newer = ctx.ownership.volume("newercluster01")
    runtime.ensure_volume(newer, "newercluster01")
    runtime.ensure_image("img")
    runtime.create(_spec("newercluster01", newer))
    runtime.start("newercluster01")
    with ctx.transaction() as s:
        s.execute(update(Installation).values(restored_at=clock.now()))
    rec.scan_volumes()
    (row,) = _orphans(ctx)
    assert row.name == newer and row.delete_after is None and row.deleted_at is None
    rec.observe()  # its container, first seen unknown
    rec.wait_idle(timeout=10)
    clock.advance(ctx.settings.orphan_volume_retention_hours * 3600 * 10)
    rec.observe()  # past the grace: stopped and kept
    rec.wait_idle(timeout=10)
    rec.scan_volumes()
    assert newer in runtime.volumes
    assert runtime.containers["newercluster01"].state == ContainerState.EXITED
    assert _orphans(ctx)[0].deleted_at is None
    # An admin deletes the orphan: the container that holds it goes first.
    assert delete_quarantined(ctx, runtime, _orphans(ctx)[0], "admin")
    assert newer not in runtime.volumes and "newercluster01" not in runtime.containers
    rec.stop()
