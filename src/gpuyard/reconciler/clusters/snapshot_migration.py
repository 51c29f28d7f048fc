"""Moving what earlier versions kept in the installation-wide snapshot repository into
each account's own repository (storage/account_repositories.py), once, at start-up.

For each account with ready snapshots still there: ``restic copy`` of those snapshots
into the account's repository (made with the shared one's chunker parameters, so later
snapshots de-duplicate against the copies), then each row is pointed at its copy (found
by the snapshot's tag) with a guarded update. Last, every snapshot in the shared
repository whose row now points at its account's repository is forgotten there, and
the shared repository pruned.

Crash-safe and idempotent: a copy made before a crash is skipped by the next
``restic copy`` (restic recognises snapshots it copied before), a row moves only while
it still names its old data, and the shared repository is swept by what the rows say,
so a run cut off at any point is finished by the next start. Deleted and failed rows
still naming data in the shared repository are forgotten there by the usual
maintenance pass (reconciler/clusters/snapshots.py ``forget_unwanted``).
"""

from __future__ import annotations

import logging
from itertools import groupby

from gpuyard.core.errors import GpuyardError
from gpuyard.services.context import Context
from gpuyard.services.volumes import snapshot_work as work
from gpuyard.storage.account_repositories import SnapshotRepositories

log = logging.getLogger(__name__)

TAG_PREFIX = "gpuyard-snapshot:"


def migrate_shared_snapshots(ctx: Context, repositories: SnapshotRepositories) -> int:
    """Move the ready snapshots still kept in the installation-wide repository into
    their accounts' repositories, then drop them there. Returns how many rows moved.
    An account whose copy fails is logged and left for the next start; the others
    go on. Raises GpuyardError when the shared repository cannot be read."""
    shared = repositories.shared
    if not shared.exists():
        return 0
    moved = 0
    legacy = work.legacy_snapshots(ctx)
    for account_id, group in groupby(legacy, key=lambda row: row.account_id):
        rows = list(group)
        try:
            target = repositories.for_account(account_id)
            target.copy_from(shared, [row.restic_id for row in rows])
            copies: dict[str, list[str]] = {}
            for row in rows:
                found = target.find_by_tag(TAG_PREFIX + row.snapshot_id)
                if not found:
                    log.warning("snapshot %s was not copied to its account", row.snapshot_id)
                    continue
                copies[row.snapshot_id] = [s.restic_id for s in found]
                if work.moved_to_account(ctx, row.snapshot_id, row.restic_id, found[-1].restic_id):
                    moved += 1
            # Two servers starting together may each have copied a snapshot: the copy
            # its row does not name goes.
            kept = work.restic_ids_of(ctx, list(copies))
            extra = [rid for sid, rids in copies.items() for rid in rids if rid != kept.get(sid)]
            if extra:
                target.forget(extra, prune=True)
        except GpuyardError as exc:
            log.warning(
                "snapshots of account %d stay in the shared repository for now: %s",
                account_id,
                exc.message,
            )
    if moved:
        log.info("moved %d snapshots into their accounts' repositories", moved)
    _drop_moved(ctx, repositories)
    return moved


def _drop_moved(ctx: Context, repositories: SnapshotRepositories) -> None:
    """Forget (and prune) every snapshot of the shared repository whose row keeps its
    data in its account's repository now."""
    shared = repositories.shared
    tagged: dict[str, list[str]] = {}
    for snapshot in shared.snapshots():
        for tag in snapshot.tags:
            if tag.startswith(TAG_PREFIX):
                tagged.setdefault(tag.removeprefix(TAG_PREFIX), []).append(snapshot.restic_id)
    if not tagged:
        return
    done = work.in_account_repositories(ctx, list(tagged))
    stale = [restic_id for sid in done for restic_id in tagged[sid]]
    if stale:
        shared.forget(stale, prune=True)
        log.info("forgot %d moved snapshots in the shared repository", len(stale))
