"""The parent a snapshot taken beside its volume is compared against
(services/volumes/snapshot_work.py ``parent_snapshot``): the latest ready ``tree``
snapshot of the same engine volume in the account's own repository, never a deleted
one, one of another volume or account, or a ``tar`` one (real database, real restic,
the in-memory runtime, whose snapshots are ``tar``: rows are set to ``tree`` here)."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import update

from gpuyard.reconciler.loop import Reconciler
from gpuyard.services.context import Context
from gpuyard.services.tenancy.auth import Principal
from gpuyard.services.volumes import snapshot_work as work
from gpuyard.services.volumes import snapshots as svc
from gpuyard.store.schema import Snapshot
from gpuyard.testing.fake_runtime import FakeRuntime
from tests.required_parts import needs_tools
from tests.service.test_snapshot_accounts import row
from tests.service.test_snapshots import running_with_files

pytestmark = needs_tools("restic", how="apt-get install restic")


def as_tree(ctx: Context, snapshot_id: str, restic_id: str, minutes: int) -> None:
    with ctx.transaction() as session:
        session.execute(
            update(Snapshot)
            .where(Snapshot.id == snapshot_id)
            .values(
                format="tree",
                restic_id=restic_id,
                ready_at=ctx.clock.now() + timedelta(minutes=minutes),
            )
        )


def test_the_parent_is_the_volumes_latest_ready_tree_snapshot(
    ctx: Context, alice: Principal, bob: Principal, rec: Reconciler, runtime: FakeRuntime
) -> None:
    c = running_with_files(ctx, alice, rec, runtime)
    taken = []
    for _ in range(3):
        snap = svc.create_snapshot(ctx, alice, c.id, "", "")
        rec.snapshots.take(snap.id)
        taken.append(snap.id)
    new = svc.create_snapshot(ctx, alice, c.id, "", "")  # the one being taken
    mine = row(ctx, new.id)
    # Only tar snapshots so far (the in-memory runtime streams): no parent.
    assert work.parent_snapshot(ctx, mine) is None
    as_tree(ctx, taken[0], "a" * 64, 1)
    as_tree(ctx, taken[1], "b" * 64, 2)
    assert work.parent_snapshot(ctx, mine) == "b" * 64
    # A deleted one's data may be forgotten: the one before it.
    with ctx.transaction() as session:
        session.execute(
            update(Snapshot).where(Snapshot.id == taken[1]).values(deleted_at=ctx.clock.now())
        )
    assert work.parent_snapshot(ctx, mine) == "a" * 64
    # Another account's volume, or another volume of the same account: not a parent.
    other = running_with_files(ctx, bob, rec, runtime)
    theirs = svc.create_snapshot(ctx, bob, other.id, "", "")
    assert work.parent_snapshot(ctx, row(ctx, theirs.id)) is None
    second = running_with_files(ctx, alice, rec, runtime)
    elsewhere = svc.create_snapshot(ctx, alice, second.id, "", "")
    assert work.parent_snapshot(ctx, row(ctx, elsewhere.id)) is None
