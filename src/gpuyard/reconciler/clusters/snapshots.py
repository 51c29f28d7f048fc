"""Storage work: taking snapshots, restoring them into volumes, forgetting deleted ones.

Each account's snapshots live in its own restic repository with its own password
(storage/account_repositories.py). On an engine of this machine with a local
repository, restic runs in a helper beside the volume that holds only that volume
(read-only) and restic, and reaches the repository only through a REST backend server
started for that one operation (storage/volume_restic.py): a ``tree`` snapshot, compared
against the volume's previous one, so unchanged files are not read again. Elsewhere (an
engine on another host, an S3 repository) a helper that mounts the volume alone runs
``tar c`` and the stream, read through the engine's API (the runtime's VolumeIO,
runtimes/capabilities.py) and counted as it passes (storage/tar_stats.py), is piped
into ``restic backup --stdin`` here, chunk by chunk: a ``tar`` snapshot. Either way
nothing a tenant writes into a volume can make restic open a path of the control plane.

A restore goes the other way, into a new engine volume that replaces the old one only
once it is whole (the caller swaps it in), so a failed restore changes nothing: a
``tree`` snapshot by ``restic restore`` in a helper holding only the new volume where
that can run, else as a tar rebuilt from it (dump_as_volume_tar); a ``tar`` snapshot's
tar (``restic dump``) through the engine's archive upload.

Crashes: restic under this process dies with it (parent-death signal), so a stream cut
off never commits a snapshot. Partial packs and stale locks are cleaned when the server
starts (:meth:`SnapshotWorker.recover`), which then moves what earlier versions kept in
the installation-wide repository into the accounts' own (reconciler/
snapshot_migration.py). The row a crash left ``creating`` is failed by the next attempt
to take it (services/volumes/snapshot_work.py claim_snapshot).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from gpuyard.core.errors import GpuyardError, RuntimeFailure
from gpuyard.core.snapshots import SnapshotFormat
from gpuyard.observability.crash_points import crash_point
from gpuyard.reconciler.clusters.snapshot_migration import TAG_PREFIX, migrate_shared_snapshots
from gpuyard.runtimes.base import Runtime
from gpuyard.runtimes.engines.volumes import target_labels as runtime_volume_labels
from gpuyard.runtimes.volumes.copy import VolumeCopyFailed
from gpuyard.runtimes.volumes.fifo_stream import NotHere
from gpuyard.runtimes.volumes.restic_helper import can_run_here
from gpuyard.services.context import Context
from gpuyard.services.volumes import snapshot_work as work
from gpuyard.services.volumes import snapshots as svc
from gpuyard.settings import Settings
from gpuyard.storage.account_repositories import SnapshotRepositories
from gpuyard.storage.repository_gate import RepositoryGate
from gpuyard.storage.restic import ResticRepository
from gpuyard.storage.restic_dump import dump_as_volume_tar
from gpuyard.storage.tar_stats import TarCounter, counted
from gpuyard.storage.volume_restic import HelperBackup, backup_in_helper, restore_in_helper
from gpuyard.store.schema import Cluster, NetworkVolume, Snapshot

log = logging.getLogger(__name__)

RuntimeOf = Callable[[int | None], Runtime]
# The one file each restic snapshot holds: the volume's tar.
ARCHIVE_NAME = "volume.tar"
# How often a running snapshot or restore records its progress (a write each time).
PROGRESS_EVERY_S = 1.0
# How long storage work waits for the start-up recovery of the repositories.
RECOVERY_WAIT_S = 600.0


def repositories_for(settings: Settings) -> SnapshotRepositories:
    """The accounts' snapshot repositories (and the installation-wide one of earlier
    versions), as the settings name them."""
    return SnapshotRepositories(
        settings.snapshot_repository_location,
        settings.snapshot_password_path,
        cache_dir=Path(settings.home) / "cache" / "restic",
        keys_dir=Path(settings.home) / "snapshot-keys",
    )


def snapshot_tag(snapshot_id: str) -> str:
    return f"{TAG_PREFIX}{snapshot_id}"


class Throttle:
    """Calls ``fn`` with the latest value at most every ``every_s`` seconds."""

    def __init__(self, fn: Callable[[int], None], every_s: float = PROGRESS_EVERY_S) -> None:
        self._fn = fn
        self._every_s = every_s
        self._last = time.monotonic()

    def __call__(self, value: int) -> None:
        if time.monotonic() - self._last >= self._every_s:
            self._last = time.monotonic()
            self._fn(value)


class SnapshotWorker:
    """Takes, restores and forgets snapshots on the engines of their hosts."""

    def __init__(
        self,
        ctx: Context,
        runtime_of: RuntimeOf,
        repositories: SnapshotRepositories,
        worker_id: str,
    ) -> None:
        self.ctx = ctx
        self.runtime_of = runtime_of
        self.repositories = repositories
        self.worker_id = worker_id
        # Backups and restores share a repository; forget and prune hold it alone.
        self._gate = RepositoryGate()
        # Cleared while the start-up recovery runs: storage work waits for it.
        self._recovered = threading.Event()
        self._recovered.set()

    def start_recovery(self) -> None:
        """Run :meth:`recover` in the background; storage work waits for it."""
        self._recovered.clear()
        threading.Thread(
            target=self._recover_then_go, name="snapshot-recovery", daemon=True
        ).start()

    def _recover_then_go(self) -> None:
        try:
            self.recover()
        finally:
            self._recovered.set()

    def wait_recovered(self, timeout_s: float) -> bool:
        """Wait for a start-up recovery under way to end (a stop waits, so nothing
        of it runs on after the reconciler has stopped); True when none runs."""
        return self._recovered.wait(timeout_s)

    def _ready(self) -> None:
        """Wait for the start-up recovery (a crash's leftovers cleaned, earlier
        versions' snapshots moved), at most a few minutes: a recovery that hangs must
        not stop snapshots for good."""
        self._recovered.wait(RECOVERY_WAIT_S)

    def _repository(self, account_id: int, *, shared: bool = False) -> ResticRepository:
        """Account ``account_id``'s repository (``shared``: the installation-wide one
        of earlier versions, where a row not yet moved keeps its data)."""
        return self.repositories.shared if shared else self.repositories.for_account(account_id)

    # -- taking --------------------------------------------------------------------

    def take(self, snapshot_id: str) -> None:
        """Take a ``creating`` snapshot to the end: ``ready`` with its sizes, or
        ``failed`` with the reason (its partial data forgotten). Never raises.

        The volume's tar stream, read by a helper that mounts only that volume, is
        piped into restic here, into the account's own repository."""
        claim = work.claim_snapshot(self.ctx, snapshot_id, self.worker_id)
        if claim.interrupted:
            self._stop_leftover_helper(claim.host_id, claim.volume_name)
            if claim.account_id is not None:
                self._forget_tagged(snapshot_id, claim.account_id)
        snap = claim.snapshot
        if snap is None:
            return
        crash_point("snapshot.after_claim")
        began = time.monotonic()
        beat = Throttle(lambda n: work.heartbeat(self.ctx, snapshot_id, n))
        try:
            self._ready()
            runtime = self.runtime_of(snap.host_id)
            taken = self._take_beside(runtime, snap, beat) or self._take_tar(runtime, snap, beat)
        except Exception as exc:
            reason = exc.message if isinstance(exc, GpuyardError) else f"{type(exc).__name__}"
            log.warning("snapshot %s failed: %s", snapshot_id, reason)
            work.fail_snapshot(self.ctx, snapshot_id, reason)
            self._forget_tagged(snapshot_id, snap.account_id)
            self.ctx.wake()
            return
        taken = replace(taken, seconds=time.monotonic() - began)
        crash_point("snapshot.after_upload")
        if not work.finish_snapshot(self.ctx, snapshot_id, taken) and not self._forget(
            self._repository(snap.account_id), [taken.restic_id]
        ):
            # Failed meanwhile: its data is not wanted (forgotten later if not now).
            work.keep_for_forgetting(self.ctx, snapshot_id, taken.restic_id)
        self.ctx.wake()

    def _take_beside(
        self, runtime: Runtime, snap: Snapshot, beat: Callable[[int], None]
    ) -> work.Taken | None:
        """The snapshot as a ``tree``, taken by restic in a helper beside the volume
        (storage/volume_restic.py) against the volume's previous one; None where that
        cannot run (a remote engine, a repository that is not local): nothing was read
        then, and the tar stream is the way."""
        engine = runtime.docker_engine()
        if engine is None or not can_run_here(engine):
            log.info(
                "snapshot %s: streaming the tar of %s (remote engine)", snap.id, snap.volume_name
            )
            return None
        repository = self._repository(snap.account_id)
        parent = work.parent_snapshot(self.ctx, snap)
        options: dict[str, Any] = {
            "tags": [snapshot_tag(snap.id)],
            "host": self.ctx.ownership.prefix,
            "on_progress": beat,
        }

        def backup(against: str | None) -> HelperBackup:
            with self._gate.shared(repository.location):
                return backup_in_helper(
                    engine, snap.volume_name, repository, parent=against, **options
                )

        try:
            try:
                result = backup(parent)
            except RuntimeFailure as exc:
                if parent is None or not _parent_missing(exc):
                    raise
                # The parent may have been forgotten meanwhile: read every file instead.
                log.info(
                    "snapshot %s: backup against %s failed (%s); again without it",
                    snap.id,
                    parent[:8],
                    exc.message,
                )
                self._forget_tagged(snap.id, snap.account_id)
                result = backup(None)
        except NotHere as exc:
            log.info("snapshot %s: streaming the tar of %s (%s)", snap.id, snap.volume_name, exc)
            return None
        log.info(
            "snapshot %s: restic beside %s, %d files (%d unchanged), %.1f s",
            snap.id,
            snap.volume_name,
            result.files,
            result.files_unmodified,
            result.seconds,
        )
        return work.Taken(
            restic_id=result.restic_id,
            size_bytes=result.bytes,
            stored_bytes=result.data_added,
            file_count=result.files,
            stream_bytes=result.bytes,
            seconds=result.seconds,
            format=SnapshotFormat.TREE,
            files_unmodified=result.files_unmodified,
        )

    def _take_tar(
        self, runtime: Runtime, snap: Snapshot, beat: Callable[[int], None]
    ) -> work.Taken:
        counter = TarCounter()
        repository = self._repository(snap.account_id)
        repository.ensure()
        with (
            self._gate.shared(repository.location),
            runtime.volume_io().read(snap.volume_name) as chunks,
        ):
            result = repository.backup_stream(
                self._metered(counted(chunks, counter), beat),
                filename=ARCHIVE_NAME,
                tags=[snapshot_tag(snap.id)],
                host=self.ctx.ownership.prefix,
            )
        return work.Taken(
            restic_id=result.restic_id,
            size_bytes=counter.content_bytes,
            stored_bytes=result.data_added,
            file_count=counter.file_count,
            stream_bytes=result.total_bytes,
            seconds=result.seconds,
        )

    def _stop_leftover_helper(self, host_id: int | None, volume: str | None) -> None:
        """A helper an interrupted snapshot left reading ``volume`` (or one of an
        earlier version running restic beside it) is removed before the snapshot's
        data is forgotten."""
        if host_id is None or volume is None:
            return
        with contextlib.suppress(GpuyardError):
            self.runtime_of(host_id).volume_io().remove_readers(volume)

    @staticmethod
    def _metered(
        chunks: Iterator[bytes | bytearray], beat: Callable[[int], None]
    ) -> Iterator[bytes | bytearray]:
        total = 0
        for chunk in chunks:
            total += len(chunk)
            beat(total)
            yield chunk

    # -- restoring -----------------------------------------------------------------

    def restore_into(
        self,
        restore_id: int,
        holder_id: str,
        snapshot_id: str,
        host_id: int,
        target_volume: str,
        like_volume: str | None,
        cluster_id: str | None,
    ) -> None:
        """Unpack the snapshot into ``target_volume`` on ``host_id`` (made anew with the
        labels of ``like_volume``). Progress goes to the restore's row. Raises
        GpuyardError when it cannot be done; ``target_volume`` is then removed (best
        effort) and the holder's own volume was never touched."""
        with self.ctx.read() as session:
            snap = session.get(Snapshot, snapshot_id)
            restic_id = snap.restic_id if snap is not None else None
            total = snap.bytes_done if snap is not None else 0
            fmt = SnapshotFormat(snap.format) if snap is not None else SnapshotFormat.TAR
            account_id = snap.account_id if snap is not None else 0
            shared = snap is not None and snap.repository is None
            # The size the restored volume is held to: its holder's (sized volumes,
            # runtimes/volumes/images.py).
            holder_gb = _holder_size(session.get(Cluster, holder_id)) or _holder_size(
                session.get(NetworkVolume, holder_id)
            )
        if restic_id is None:
            raise RuntimeFailure(f"snapshot {snapshot_id} has no data in the repository")
        work.restore_progress(self.ctx, restore_id, 0, total)
        beat = Throttle(lambda n: work.restore_progress(self.ctx, restore_id, n, total))
        runtime = self.runtime_of(host_id)
        try:
            self._ready()
            if shared:  # moved by the start-up recovery, unless it failed
                with self.ctx.read() as session:
                    moved = session.get(Snapshot, snapshot_id)
                    if moved is not None and moved.repository is not None:
                        shared, restic_id = False, moved.restic_id or restic_id
            repository = self._repository(account_id, shared=shared)
            with self._gate.shared(repository.location):
                self._restore(
                    runtime,
                    repository,
                    fmt,
                    restic_id,
                    target_volume,
                    like_volume,
                    cluster_id,
                    beat,
                    holder_gb,
                )
        except Exception as exc:
            with contextlib.suppress(GpuyardError):
                runtime.remove_volume(target_volume)
            if isinstance(exc, GpuyardError):
                raise
            raise RuntimeFailure(f"restore failed: {type(exc).__name__}: {exc}") from exc
        work.restore_progress(self.ctx, restore_id, total, total)
        log.info("restored snapshot %s into %s (%s)", snapshot_id, target_volume, holder_id)

    @staticmethod
    def _restore(
        runtime: Runtime,
        repository: ResticRepository,
        fmt: SnapshotFormat,
        restic_id: str,
        target_volume: str,
        like_volume: str | None,
        cluster_id: str | None,
        beat: Callable[[int], None],
        size_gb: int = 0,
    ) -> None:
        """Write the snapshot into ``target_volume`` (held to ``size_gb`` GiB at least):
        a ``tree`` by restic in a helper beside the new volume where it can run
        (storage/volume_restic.py), else as a tar stream through the engine's archive
        upload (restic runs here; only the stream reaches the engine)."""
        engine = runtime.docker_engine()
        if fmt == SnapshotFormat.TREE and engine is not None and can_run_here(engine):
            labels = runtime_volume_labels(engine, like_volume, cluster_id, size_gb)
            try:
                seconds = restore_in_helper(engine, target_volume, labels, repository, restic_id)
                log.info(
                    "restored %s into %s by restic beside it, %.1f s",
                    restic_id[:8],
                    target_volume,
                    seconds,
                )
                return
            except NotHere as exc:
                log.info("restore into %s: streaming (%s)", target_volume, exc)
        source: contextlib.AbstractContextManager[Iterator[Any]] = (
            dump_as_volume_tar(repository, restic_id)
            if fmt == SnapshotFormat.TREE
            else repository.dump_stream(restic_id, ARCHIVE_NAME)
        )
        with source as chunks:
            runtime.volume_io().write(
                target_volume,
                cluster_id,
                chunks,
                like=like_volume,
                on_progress=beat,
                size_gb=size_gb,
            )

    def restore_network_volume(self, volume_id: str) -> None:
        """Carry out the pending restore of a network volume and swap the restored
        copy in. Never raises: a failure is recorded on the restore and the network
        volume keeps its data."""
        restore = svc.pending_restore(self.ctx, volume_id)
        if restore is None:
            return
        with self.ctx.read() as session:
            volume = session.get(NetworkVolume, volume_id)
            old = volume.volume_name if volume is not None else None
        if old is None:
            work.finish_restore(self.ctx, restore.id, error="the network volume is gone")
            return
        try:
            self.restore_into(
                restore.id,
                volume_id,
                restore.snapshot_id,
                restore.host_id,
                restore.target_volume,
                old,
                None,
            )
        except GpuyardError as exc:
            work.finish_restore(self.ctx, restore.id, error=exc.message)
            return
        crash_point("restore.network_volume.after_unpack")
        swapped = work.swap_network_volume(self.ctx, restore.id, volume_id, restore.target_volume)
        crash_point("restore.network_volume.after_swap")
        with contextlib.suppress(GpuyardError):
            # The replaced volume, or the copy nobody will use.
            self.runtime_of(restore.host_id).remove_volume(
                old if swapped else restore.target_volume
            )
        self.ctx.wake()

    # -- forgetting ----------------------------------------------------------------

    def forget_unwanted(self) -> None:
        """Forget the data of deleted and failed snapshots (prune included), each in
        its repository. A repository busy with a backup refuses its exclusive lock:
        tried again on the next pass."""
        found = work.data_to_forget(self.ctx)
        if not found:
            return
        self._recovered.wait(RECOVERY_WAIT_S)
        by_repository: dict[tuple[int, bool], list[work.Unwanted]] = {}
        for row in found:
            key = (0 if row.shared else row.account_id, row.shared)
            by_repository.setdefault(key, []).append(row)
        for (account_id, shared), rows in by_repository.items():
            repository = self._repository(account_id, shared=shared)
            if self._forget(repository, [row.restic_id for row in rows]):
                work.forgotten(self.ctx, [row.snapshot_id for row in rows])

    def _forget(self, repository: ResticRepository, restic_ids: list[str]) -> bool:
        if not restic_ids:
            return True
        with self._gate.exclusive(repository.location) as alone:
            if not alone:
                log.info("cannot forget snapshot data yet: %s is in use", repository.location)
                return False
            try:
                repository.forget(restic_ids, prune=True)
            except GpuyardError as exc:
                log.info("cannot forget snapshot data yet: %s", exc.message)
                return False
        return True

    def _forget_tagged(self, snapshot_id: str, account_id: int) -> None:
        """Forget whatever the account's repository holds for ``snapshot_id`` (a
        backup that committed before its snapshot failed). What cannot be forgotten
        now (the repository busy) is recorded on the failed row, so the maintenance
        pass forgets it later."""
        self._recovered.wait(RECOVERY_WAIT_S)
        with contextlib.suppress(GpuyardError):
            repository = self._repository(account_id)
            if not repository.exists():
                return
            found = [s.restic_id for s in repository.find_by_tag(snapshot_tag(snapshot_id))]
            if found and not self._forget(repository, found):
                work.keep_for_forgetting(self.ctx, snapshot_id, found[0])

    def recover(self) -> None:
        """At start: remove stale locks and partial data a killed backup left, so each
        repository that exists checks clean; then move the snapshots earlier versions
        kept in the installation-wide repository into their accounts' own."""
        repositories = [self.repositories.shared]
        with contextlib.suppress(GpuyardError):
            repositories += [
                self.repositories.for_account(account)
                for account in work.accounts_with_snapshots(self.ctx)
            ]
        for repository in repositories:
            try:
                if repository.exists():
                    result = repository.recover_after_crash()
                    if not result.ok:
                        log.error(
                            "snapshot repository %s check failed: %s",
                            repository.location,
                            result.output[-2000:],
                        )
            except GpuyardError as exc:
                log.warning(
                    "snapshot repository %s cannot be checked now: %s",
                    repository.location,
                    exc.message,
                )
        try:
            migrate_shared_snapshots(self.ctx, self.repositories)
        except GpuyardError as exc:
            log.warning("snapshots cannot be moved to their accounts now: %s", exc.message)


def _parent_missing(exc: RuntimeFailure) -> bool:
    """Whether restic failed because the parent snapshot is gone (forgotten meanwhile):
    its fatal error names the id it could not find."""
    stderr = str(exc.details.get("stderr", ""))
    # restic 0.14: "Fatal: unable to load parent snapshot …" / "… no matching ID found".
    return (
        not isinstance(exc, VolumeCopyFailed)
        and exc.details.get("exit_status") == 1
        and ("no matching ID" in stderr or "parent snapshot" in stderr.lower())
    )


def _holder_size(holder: Cluster | NetworkVolume | None) -> int:
    """The GiB a restore's holder's volume is held to (0: none known)."""
    if isinstance(holder, Cluster):
        return holder.volume_gb
    if isinstance(holder, NetworkVolume):
        return holder.size_gb
    return 0
