"""Storage work: taking snapshots, restoring them into volumes, forgetting deleted ones.

Two ways to keep a volume in the restic repository (storage/restic.py), both reading it
through a short-lived helper container of ours, never the user's container:

- ``tree`` (an engine on this machine): restic itself runs in the helper beside the
  volume (storage/volume_restic.py) and compares it with the volume's previous
  snapshot, so files whose size, mtime, inode and ctime did not change are not read
  again: a snapshot after a small change reads only what changed.
- ``tar`` (any engine, a host over SSH too): the helper runs ``tar c`` and the stream
  is read through the engine's API (runtimes/volume_archive.py), counted as it passes
  (storage/tar_stats.py) and piped into ``restic backup --stdin`` chunk by chunk, never
  whole in memory; content-defined chunking still stores only what changed, but every
  byte is read and hashed each time.

A restore goes the other way, into a new engine volume that replaces the old one only
once it is whole (the caller swaps it in), so a failed restore changes nothing. A
``tree`` restored on an engine where restic cannot run beside the volume is streamed
as a tar rebuilt from the snapshot (dump_as_volume_tar).

Crashes: restic under this process dies with it (parent-death signal), so a stream cut
off never commits a snapshot; a helper's restic is killed by the next attempt on its
volume. Partial packs and stale locks are cleaned when the server starts
(:meth:`SnapshotWorker.recover`). The row a crash left ``creating`` is failed by the
next attempt to take it (services/snapshot_work.py claim_snapshot).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

from gpuyard.core.errors import GpuyardError, RuntimeFailure
from gpuyard.core.ownership import LABEL_CLUSTER
from gpuyard.core.snapshots import SnapshotFormat
from gpuyard.runtimes.base import Runtime
from gpuyard.runtimes.engine import Engine
from gpuyard.runtimes.engine_disk import with_size
from gpuyard.runtimes.volume_archive import engine_of, read_volume, write_volume
from gpuyard.runtimes.volume_copy import remove_helpers, volume_labels
from gpuyard.services import snapshot_work as work
from gpuyard.services import snapshots as svc
from gpuyard.services.context import Context
from gpuyard.settings import Settings
from gpuyard.storage.restic import ResticRepository
from gpuyard.storage.restic_dump import dump_as_volume_tar
from gpuyard.storage.tar_stats import TarCounter, counted
from gpuyard.storage.volume_restic import (
    backup_volume,
    helper_restic_available,
    remove_restic_helpers,
    restore_volume,
)
from gpuyard.store.schema import Cluster, NetworkVolume, Snapshot

log = logging.getLogger(__name__)

RuntimeOf = Callable[[int | None], Runtime]
# The one file each restic snapshot holds: the volume's tar.
ARCHIVE_NAME = "volume.tar"
# How often a running snapshot or restore records its progress (a write each time).
PROGRESS_EVERY_S = 1.0
# How long storage work waits for the start-up recovery of the repository.
RECOVERY_WAIT_S = 300.0


def repository_for(settings: Settings) -> ResticRepository:
    """The installation's snapshot repository, as the settings name it."""
    return ResticRepository(
        settings.snapshot_repository_location,
        settings.snapshot_password_path,
        cache_dir=Path(settings.home) / "cache" / "restic",
    )


def snapshot_tag(snapshot_id: str) -> str:
    return f"gpuyard-snapshot:{snapshot_id}"


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
        repository: ResticRepository,
        worker_id: str,
    ) -> None:
        self.ctx = ctx
        self.runtime_of = runtime_of
        self.repository = repository
        self.worker_id = worker_id
        # Forget and prune take the repository's exclusive lock: one at a time here.
        self._forget_lock = threading.Lock()
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

    def _ready(self) -> None:
        """Wait for the start-up recovery (a crash's leftovers cleaned), at most a few
        minutes: a recovery that hangs must not stop snapshots for good."""
        self._recovered.wait(RECOVERY_WAIT_S)
        self.repository.ensure()

    # -- taking --------------------------------------------------------------------

    def take(self, snapshot_id: str) -> None:
        """Take a ``creating`` snapshot to the end: ``ready`` with its sizes, or
        ``failed`` with the reason (its partial data forgotten). Never raises.

        On an engine of this machine restic runs beside the volume in a helper and
        compares with the volume's previous snapshot (a ``tree``: unchanged files are
        not read again); elsewhere the volume's tar stream is piped into restic (a
        ``tar``)."""
        claim = work.claim_snapshot(self.ctx, snapshot_id, self.worker_id)
        if claim.interrupted:
            self._stop_leftover_helper(claim.host_id, claim.volume_name)
            self._forget_tagged(snapshot_id)
        snap = claim.snapshot
        if snap is None:
            return
        began = time.monotonic()
        beat = Throttle(lambda n: work.heartbeat(self.ctx, snapshot_id, n))
        try:
            self._ready()
            runtime = self.runtime_of(snap.host_id)
            engine = self._beside(runtime)
            if engine is not None:
                taken = self._take_tree(engine, snap, beat)
            else:
                taken = self._take_tar(runtime, snap, beat)
        except Exception as exc:
            reason = exc.message if isinstance(exc, GpuyardError) else f"{type(exc).__name__}"
            log.warning("snapshot %s failed: %s", snapshot_id, reason)
            work.fail_snapshot(self.ctx, snapshot_id, reason)
            self._forget_tagged(snapshot_id)
            self.ctx.wake()
            return
        taken = replace(taken, seconds=time.monotonic() - began)
        if not work.finish_snapshot(self.ctx, snapshot_id, taken) and not self._forget(
            [taken.restic_id]
        ):
            # Failed meanwhile: its data is not wanted (forgotten later if not now).
            work.keep_for_forgetting(self.ctx, snapshot_id, taken.restic_id)
        self.ctx.wake()

    def _take_tree(self, engine: Engine, snap: Snapshot, beat: Callable[[int], None]) -> work.Taken:
        result = backup_volume(
            engine,
            snap.volume_name,
            self.repository,
            tags=[snapshot_tag(snap.id)],
            host=self.ctx.ownership.prefix,
            parent=work.parent_for(self.ctx, snap),
            on_progress=beat,
        )
        return work.Taken(
            restic_id=result.restic_id,
            size_bytes=result.bytes,
            stored_bytes=result.data_added,
            file_count=result.files,
            stream_bytes=result.bytes,
            seconds=result.seconds,
            format=SnapshotFormat.TREE,
        )

    def _take_tar(
        self, runtime: Runtime, snap: Snapshot, beat: Callable[[int], None]
    ) -> work.Taken:
        counter = TarCounter()
        with read_volume(runtime, snap.volume_name) as chunks:
            result = self.repository.backup_stream(
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

    def _beside(self, runtime: Runtime) -> Engine | None:
        """The engine of ``runtime`` when restic can run in a helper beside its volumes
        (an engine of this machine, and the setting allows it); else None."""
        engine = engine_of(runtime)
        if engine is None or not self.ctx.settings.snapshot_restic_beside_volume:
            return None
        return engine if helper_restic_available(engine, self.repository) else None

    def _stop_leftover_helper(self, host_id: int | None, volume: str | None) -> None:
        """A restic helper an interrupted snapshot left reading ``volume`` is removed
        (its restic killed) before its data is forgotten, so it commits nothing."""
        if host_id is None or volume is None:
            return
        with contextlib.suppress(GpuyardError):
            engine = engine_of(self.runtime_of(host_id))
            if engine is not None:
                remove_restic_helpers(engine, volume)
                remove_helpers(engine, volume)  # a tar stream's reader

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
            # The size the restored volume is held to: its holder's (sized volumes,
            # runtimes/volume_images.py).
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
            self._restore(
                runtime, fmt, restic_id, target_volume, like_volume, cluster_id, beat, holder_gb
            )
        except Exception as exc:
            with contextlib.suppress(GpuyardError):
                runtime.remove_volume(target_volume)
            if isinstance(exc, GpuyardError):
                raise
            raise RuntimeFailure(f"restore failed: {type(exc).__name__}: {exc}") from exc
        work.restore_progress(self.ctx, restore_id, total, total)
        log.info("restored snapshot %s into %s (%s)", snapshot_id, target_volume, holder_id)

    def _restore(
        self,
        runtime: Runtime,
        fmt: SnapshotFormat,
        restic_id: str,
        target_volume: str,
        like_volume: str | None,
        cluster_id: str | None,
        beat: Callable[[int], None],
        size_gb: int = 0,
    ) -> None:
        """Write the snapshot into ``target_volume`` (held to ``size_gb`` GiB at least):
        a ``tree`` by restic beside the volume where it can run, else (and for a
        ``tar``) as a tar stream through the engine's archive upload."""
        engine = self._beside(runtime) if fmt == SnapshotFormat.TREE else None
        if engine is not None:
            labels: dict[str, str] = {}
            if like_volume is not None:
                with contextlib.suppress(GpuyardError):
                    labels = volume_labels(engine, like_volume)
            restore_volume(
                engine,
                target_volume,
                with_size(
                    labels or engine.labels({LABEL_CLUSTER: cluster_id} if cluster_id else {}),
                    size_gb,
                ),
                self.repository,
                restic_id,
                on_progress=beat,
            )
            return
        source = (
            dump_as_volume_tar(self.repository, restic_id)
            if fmt == SnapshotFormat.TREE
            else self.repository.dump_stream(restic_id, ARCHIVE_NAME)
        )
        with source as chunks:
            write_volume(
                runtime,
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
        swapped = work.swap_network_volume(self.ctx, restore.id, volume_id, restore.target_volume)
        with contextlib.suppress(GpuyardError):
            # The replaced volume, or the copy nobody will use.
            self.runtime_of(restore.host_id).remove_volume(
                old if swapped else restore.target_volume
            )
        self.ctx.wake()

    # -- forgetting ----------------------------------------------------------------

    def forget_unwanted(self) -> None:
        """Forget the data of deleted and failed snapshots (prune included). A
        repository busy with a backup refuses its exclusive lock: tried again on the
        next pass."""
        found = work.data_to_forget(self.ctx)
        if not found:
            return
        self._recovered.wait(RECOVERY_WAIT_S)
        if self._forget([rid for _sid, rid in found if rid]):
            work.forgotten(self.ctx, [sid for sid, _rid in found])

    def _forget(self, restic_ids: list[str]) -> bool:
        if not restic_ids:
            return True
        with self._forget_lock:
            try:
                self.repository.forget(restic_ids, prune=True)
            except GpuyardError as exc:
                log.info("cannot forget snapshot data yet: %s", exc.message)
                return False
        return True

    def _forget_tagged(self, snapshot_id: str) -> None:
        """Forget whatever the repository holds for ``snapshot_id`` (a backup that
        committed before its snapshot failed). What cannot be forgotten now (the
        repository busy) is recorded on the failed row, so the maintenance pass
        forgets it later."""
        self._recovered.wait(RECOVERY_WAIT_S)
        with contextlib.suppress(GpuyardError):
            found = [s.restic_id for s in self.repository.find_by_tag(snapshot_tag(snapshot_id))]
            if found and not self._forget(found):
                work.keep_for_forgetting(self.ctx, snapshot_id, found[0])

    def recover(self) -> None:
        """At start: remove stale locks and partial data a killed backup left, so the
        repository checks clean. Only for a repository that exists already."""
        try:
            if self.repository.exists():
                result = self.repository.recover_after_crash()
                if not result.ok:
                    log.error("snapshot repository check failed: %s", result.output[-2000:])
        except GpuyardError as exc:
            log.warning("snapshot repository cannot be checked now: %s", exc.message)


def _holder_size(holder: Cluster | NetworkVolume | None) -> int:
    """The GiB a restore's holder's volume is held to (0: none known)."""
    if isinstance(holder, Cluster):
        return holder.volume_gb
    if isinstance(holder, NetworkVolume):
        return holder.size_gb
    return 0
