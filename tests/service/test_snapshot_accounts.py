"""Each account's snapshots in its own restic repository with its own password, and the
move of what earlier versions kept in the installation-wide repository (real database,
real restic, the in-memory runtime)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from sqlalchemy import update

from gpuyard.reconciler.clusters.snapshot_migration import migrate_shared_snapshots
from gpuyard.reconciler.clusters.snapshots import ARCHIVE_NAME, snapshot_tag
from gpuyard.reconciler.loop import Reconciler
from gpuyard.services.clusters import use_cases as uc
from gpuyard.services.context import Context
from gpuyard.services.tenancy.auth import Principal
from gpuyard.services.volumes import snapshots as svc
from gpuyard.storage.account_repositories import account_password
from gpuyard.store.schema import Snapshot
from gpuyard.testing.fake_runtime import FakeRuntime
from tests.required_parts import needs_tools
from tests.service.test_lifecycle import a6000, settle
from tests.service.test_snapshots import FILES, running_with_files, volume_files

pytestmark = needs_tools("restic", how="apt-get install restic")


def opens(repository: str, password_file: Path) -> bool:
    """Whether ``password_file`` opens the restic repository at ``repository``."""
    done = subprocess.run(
        ["restic", "--repo", repository, "--password-file", str(password_file), "--no-cache",
         "cat", "config"],
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    return done.returncode == 0


def row(ctx: Context, snapshot_id: str) -> Snapshot:
    with ctx.read() as session:
        snap = session.get(Snapshot, snapshot_id)
        assert snap is not None
        session.expunge(snap)
        return snap


def test_each_account_has_its_own_repository_and_password(
    ctx: Context,
    alice: Principal,
    bob: Principal,
    rec: Reconciler,
    runtime: FakeRuntime,
    tmp_path: Path,
) -> None:
    repos = rec.snapshots.repositories
    taken = {}
    for who in (alice, bob):
        c = running_with_files(ctx, who, rec, runtime)
        snap = svc.create_snapshot(ctx, who, c.id, "", "")
        rec.snapshots.take(snap.id)
        assert svc.get_snapshot(ctx, who, snap.id).status == "ready"
        assert row(ctx, snap.id).repository == "account"
        taken[who.account_id] = snap.id
    a_location, b_location = (repos.location_of(p.account_id) for p in (alice, bob))
    assert a_location != b_location
    a_password, b_password = (repos.password_file_of(p.account_id) for p in (alice, bob))
    assert a_password.read_text() != b_password.read_text()
    # Each password opens its own repository and not the other's; nothing is written
    # to the installation-wide one.
    assert opens(a_location, a_password) and opens(b_location, b_password)
    assert not opens(a_location, b_password)
    assert not opens(b_location, a_password)
    assert not repos.shared.exists()
    # The installation secret opens neither (it only derives their passwords).
    secret = ctx.settings.snapshot_password_path
    assert not opens(a_location, secret)
    assert b_password.read_text().strip() == account_password(
        secret.read_text().strip(), bob.account_id
    )
    assert repos.for_account(alice.account_id).find_by_tag(snapshot_tag(taken[alice.account_id]))
    assert not repos.for_account(bob.account_id).find_by_tag(snapshot_tag(taken[alice.account_id]))


def legacy_snapshot(ctx: Context, rec: Reconciler, snapshot_id: str) -> str:
    """Put a taken snapshot's data into the installation-wide repository, as earlier
    versions kept it, and point its row there. Returns its restic id there."""
    repos = rec.snapshots.repositories
    snap = row(ctx, snapshot_id)
    assert snap.restic_id is not None
    own = repos.for_account(snap.account_id)
    with own.dump_stream(snap.restic_id, ARCHIVE_NAME) as chunks:
        data = b"".join(chunks)
    legacy = repos.shared.backup_stream(
        [data], filename=ARCHIVE_NAME, tags=[snapshot_tag(snapshot_id)], host="old"
    )
    own.forget([snap.restic_id])
    with ctx.transaction() as session:
        session.execute(
            update(Snapshot)
            .where(Snapshot.id == snapshot_id)
            .values(restic_id=legacy.restic_id, repository=None)
        )
    return legacy.restic_id


def test_snapshots_of_the_shared_repository_move_to_their_accounts(
    ctx: Context, alice: Principal, bob: Principal, rec: Reconciler, runtime: FakeRuntime
) -> None:
    repos = rec.snapshots.repositories
    snaps = {}
    for who in (alice, bob):
        c = running_with_files(ctx, who, rec, runtime)
        snap = svc.create_snapshot(ctx, who, c.id, "", "")
        rec.snapshots.take(snap.id)
        snaps[who.account_id] = snap.id
    old = {account: legacy_snapshot(ctx, rec, sid) for account, sid in snaps.items()}
    assert len(repos.shared.snapshots()) == 2

    # A start cut off after alice's copy was made, before her row was moved.
    repos.for_account(alice.account_id).copy_from(repos.shared, [old[alice.account_id]])
    # Another server starting at the same time already put a copy of bob's there.
    with repos.shared.dump_stream(old[bob.account_id], ARCHIVE_NAME) as chunks:
        data = b"".join(chunks)
    repos.for_account(bob.account_id).backup_stream(
        [data], filename=ARCHIVE_NAME, tags=[snapshot_tag(snaps[bob.account_id])], host="x"
    )
    rec.snapshots.recover()

    for account, sid in snaps.items():
        moved = row(ctx, sid)
        assert moved.repository == "account"
        assert moved.restic_id != old[account]
        found = repos.for_account(account).find_by_tag(snapshot_tag(sid))
        assert [s.restic_id for s in found] == [moved.restic_id]  # one copy kept
    assert repos.shared.snapshots() == []  # nothing left under the shared password
    # Idempotent: a second start changes nothing.
    assert migrate_shared_snapshots(ctx, repos) == 0

    # A moved snapshot restores from its account's repository.
    clone = uc.create_cluster(ctx, bob, a6000(1, snapshot_id=snaps[bob.account_id]))
    settle(rec, clone.id)
    assert uc.get_cluster(ctx, bob, clone.id).status == "running"
    assert volume_files(ctx, runtime, clone.id) == FILES


def test_deleted_snapshots_of_the_shared_repository_are_forgotten_there(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime
) -> None:
    repos = rec.snapshots.repositories
    c = running_with_files(ctx, alice, rec, runtime)
    snap = svc.create_snapshot(ctx, alice, c.id, "", "")
    rec.snapshots.take(snap.id)
    legacy_snapshot(ctx, rec, snap.id)
    svc.delete_snapshot(ctx, alice, snap.id)
    rec.snapshots.recover()  # a deleted snapshot is not moved
    assert row(ctx, snap.id).repository is None
    rec.snapshots.forget_unwanted()
    assert repos.shared.snapshots() == []
    assert row(ctx, snap.id).restic_id is None


def test_a_shared_repository_read_before_it_moved_still_restores(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime
) -> None:
    """A row still naming the installation-wide repository (its move failed) is
    restored from there."""
    c = running_with_files(ctx, alice, rec, runtime)
    snap = svc.create_snapshot(ctx, alice, c.id, "", "")
    rec.snapshots.take(snap.id)
    legacy_snapshot(ctx, rec, snap.id)
    clone = uc.create_cluster(ctx, alice, a6000(1, snapshot_id=snap.id))
    settle(rec, clone.id)
    assert volume_files(ctx, runtime, clone.id) == FILES
