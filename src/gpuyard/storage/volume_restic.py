"""Snapshots taken and restored by restic running beside the volume, in a helper that
holds only the volume and restic (runtimes/volumes/restic_helper.py), reaching the
account's repository only through a REST backend server of ours that serves that one
repository for that one operation (storage/rest_server.py, as a child process:
storage/rest_process.py).

Why: a snapshot read as a tar stream (the path every engine supports) makes restic
read and hash every byte every time. Given the volume's files and its previous
snapshot as ``--parent``, restic skips each file whose size, mtime, ctime and inode are
unchanged, so a snapshot after a small change reads only what changed; and a restore
is ``restic restore`` (restic's parallel restorer) straight into the new volume.

Why this is safe where restic beside the volume was not (docs/decisions.md): restic
in the helper can open only the helper's files. The repository is not mounted; it is
reached over HTTP on the loopback interface of the helper's own network namespace,
where the server listens (it enters that namespace) and nothing else can connect. The
server's credential and the key restic opens the repository with are made for the
operation and die with it: the key is never written to the repository (the server
serves it from memory, and no other key), and the repository's own password never
enters the helper. The server lets a backup add objects and its own locks, and a
restore only read; neither can replace or delete anything, nor reach a path outside
the repository.

Only for a local repository whose password is one of ours (random, so cheap-keyed:
storage/restic_keys.py) and an engine on this machine; elsewhere :class:`NotHere` is
raised before anything ran, and callers stream the volume's tar instead.

Snapshots taken here are ``tree`` snapshots (core/snapshots.py): the volume's files
under ``/data``, host and path stable so a volume's snapshots follow one another. The
parent is passed explicitly (``--parent``), never guessed by restic (which would take
the latest snapshot of any volume with the same host and path); none reads every file
(``--force``).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuyard.core.errors import GpuyardError, RuntimeFailure
from gpuyard.runtimes.engines.engine import Engine
from gpuyard.runtimes.volumes.copy import MOUNT, _reset_volume, volume_labels
from gpuyard.runtimes.volumes.fifo_stream import NotHere
from gpuyard.runtimes.volumes.restic_helper import (
    SERVER_GONE,
    HelperResult,
    failure,
    remove_restic_helpers,
    restic_helper,
)
from gpuyard.storage.rest_objects import Mode
from gpuyard.storage.rest_process import RestServer, RestServerFailed
from gpuyard.storage.restic import ResticRepository, check_id, refused_for_lock

log = logging.getLogger(__name__)

Progress = Callable[[int], None]

# How long a backup or restore waits out another process's lock on the repository (a
# prune of an installation sharing it): restic 0.14 refuses instead of waiting.
LOCK_PATIENCE_S = 600.0
LOCK_RETRY_S = 2.0


@dataclass(frozen=True)
class HelperBackup:
    """A snapshot restic committed in a helper: ``files`` and ``bytes`` what it
    processed (every file of the volume, read or found unchanged), ``data_added`` what
    the repository grew by, and how restic judged the files against the parent."""

    restic_id: str
    files: int
    bytes: int
    data_added: int
    seconds: float
    files_new: int = 0
    files_changed: int = 0
    files_unmodified: int = 0


def backup_in_helper(
    engine: Engine,
    volume: str,
    repository: ResticRepository,
    *,
    tags: Sequence[str],
    host: str,
    parent: str | None,
    on_progress: Progress | None = None,
) -> HelperBackup:
    """Snapshot our volume ``volume`` on ``engine`` into ``repository`` with restic in a
    helper (see the module docstring): ``/data`` with ``host`` and ``tags``, compared
    against ``parent`` (None: every file read). ``on_progress`` gets the bytes restic
    has processed, about twice a second.

    Raises NotHere (nothing ran: stream the tar instead), VolumeCopyFailed for a volume
    missing or not ours, RuntimeFailure when restic or the engine fails (exit status 3
    is a failure too: restic could not read some files), ValueError for a bad tag,
    host or parent."""
    for tag in tags:
        if not tag or "," in tag:
            raise ValueError(f"invalid restic tag {tag!r}")
    if not host or host.startswith("-") or "," in host:
        raise ValueError(f"invalid restic host {host!r}")
    if parent is not None:
        check_id(parent)
    began = time.monotonic()
    root, key = _helper_access(repository)
    volume_labels(engine, volume)  # ours, or VolumeCopyFailed
    args = ["--no-cache", "backup", MOUNT, "--json", "--host", host]
    for tag in tags:
        args += ["--tag", tag]
    args += ["--parent", parent] if parent is not None else ["--force"]

    def on_json(doc: dict[str, Any]) -> None:
        if on_progress is not None and doc.get("message_type") == "status":
            on_progress(int(doc.get("bytes_done") or 0))

    result = _run(engine, volume, repository, args, Mode.BACKUP, root, key, on_json, True)
    summary = result.summary or {}
    short_id = summary.get("snapshot_id")
    if result.exit_status != 0 or not isinstance(short_id, str):
        raise failure("backup", volume, engine, result)
    total = int(summary.get("total_bytes_processed") or 0)
    if on_progress is not None:
        on_progress(total)
    return HelperBackup(
        restic_id=repository.resolve_id(short_id, host=host, tags=tags, path=MOUNT),
        files=int(summary.get("total_files_processed") or 0),
        bytes=total,
        data_added=int(summary.get("data_added") or 0),
        seconds=time.monotonic() - began,
        files_new=int(summary.get("files_new") or 0),
        files_changed=int(summary.get("files_changed") or 0),
        files_unmodified=int(summary.get("files_unmodified") or 0),
    )


def restore_in_helper(
    engine: Engine,
    target_volume: str,
    labels: Mapping[str, str],
    repository: ResticRepository,
    restic_id: str,
) -> float:
    """Make ``target_volume`` on ``engine`` anew (ours, with ``labels``) and restore the
    ``tree`` snapshot ``restic_id`` into it with ``restic restore`` in a helper that
    holds only that volume (read-write) and restic: owners, modes, mtimes, symlinks,
    hard links, empty directories, FIFOs and device nodes, and the volume root's own
    metadata. Returns the seconds it took.

    Raises NotHere (nothing ran; the volume may have been made empty), RuntimeFailure
    when restic or the engine fails (the target may be partial: restore into a volume
    nobody uses yet and swap it in)."""
    check_id(restic_id)
    began = time.monotonic()
    root, key = _helper_access(repository)
    with engine.errors(f"preparing volume {target_volume}"):
        # A helper of an earlier attempt (a server killed mid-restore) holds it still.
        remove_restic_helpers(engine, target_volume)
        _reset_volume(engine, target_volume, labels)
    args = ["--no-cache", "restore", restic_id, "--target", "/"]
    result = _run(engine, target_volume, repository, args, Mode.RESTORE, root, key, None, False)
    if result.exit_status != 0:
        raise failure("restore", target_volume, engine, result)
    return time.monotonic() - began


def _helper_access(repository: ResticRepository) -> tuple[Any, Any]:
    """The repository's root and the operation's key for a helper (NotHere: restic
    cannot reach it from one; nothing ran)."""
    access = repository.helper_access()
    if access is None:
        raise NotHere(f"restic cannot reach {repository.location} from a helper")
    return access


def _run(
    engine: Engine,
    volume: str,
    repository: ResticRepository,
    args: Sequence[str],
    mode: Mode,
    root: Any,
    key: Any,
    on_json: Callable[[dict[str, Any]], None] | None,
    read_only: bool,
) -> HelperResult:
    """``restic args`` in a helper holding ``volume``, against ``root`` served for this
    run only; the credential and key are scrubbed from what restic printed. Refused
    for another process's lock, it runs again (stale locks removed first) for up to
    LOCK_PATIENCE_S: restic refused before it read or wrote anything."""
    give_up = time.monotonic() + LOCK_PATIENCE_S
    while True:
        result = _run_once(engine, volume, args, mode, root, key, on_json, read_only, repository)
        if result.exit_status == 0 or not refused_for_lock(result.stderr):
            return result
        if time.monotonic() >= give_up:
            return result
        log.info("restic on volume %s waits for a lock on %s", volume, repository.location)
        time.sleep(LOCK_RETRY_S)
        with contextlib.suppress(GpuyardError):
            repository.unlock()


def _run_once(
    engine: Engine,
    volume: str,
    args: Sequence[str],
    mode: Mode,
    root: Any,
    key: Any,
    on_json: Callable[[dict[str, Any]], None] | None,
    read_only: bool,
    repository: ResticRepository,
) -> HelperResult:
    # The server's child starts while the engine starts the helper; it listens once
    # the helper's network namespace exists, and is closed before the helper goes.
    binary = repository.binary()
    try:
        with (
            RestServer(root, mode, {key.name: key.content}) as server,
            restic_helper(engine, volume, args, binary=binary, read_only=read_only) as run,
        ):
            server.listen(run.netns_fd)
            run.go({"repo": server.url().encode(), "pw": key.password.encode()})
            result = run.wait(on_json, serving=server.serving)
            server.close()
    except RestServerFailed as exc:
        # Raised before go(): restic never ran (a setns refused, say). The operation
        # streams instead of failing.
        raise NotHere(f"{exc.message} ({(exc.details or {}).get('stderr', '')[-300:]})") from exc
    for secret in (server.password, key.password):
        result.stderr = result.stderr.replace(secret, "***")
    if result.exit_status == SERVER_GONE:
        raise RuntimeFailure(
            f"the repository server of volume {volume}'s restic ended before restic did",
            {"volume": volume, "stderr": result.stderr},
        )
    if result.exit_status < 0:
        raise RuntimeFailure(
            f"the restic helper of volume {volume} ended before restic did",
            {"volume": volume, "stderr": result.stderr},
        )
    return result
