"""Snapshots of a volume taken and restored by restic running beside it: a short-lived
helper container of ours mounts the volume and runs this machine's restic against the
snapshot repository (storage/restic.py).

Why: streaming ``tar c`` of the volume into ``restic backup --stdin`` (the path that
works on any engine, runtimes/volume_copy.py) makes restic read and hash every byte
every time. Given a directory and a parent snapshot, restic skips each file whose size,
mtime, inode and ctime are unchanged, so a snapshot after a small change reads only
what changed.

Only for an engine on this machine (:func:`helper_restic_available`): the helper
bind-mounts paths of this machine. Elsewhere snapshots keep the stream path, and a
snapshot taken here is restored there from :func:`dump_as_volume_tar`.

The helper is the helper image (runtimes/helper_image.py: static busybox, no /lib,
/lib64 or /usr/lib of its own, so nothing clashes) with these bind mounts, read-only
unless said:

* the volume at ``/data`` (read-write only for a restore);
* restic's binary, its ELF interpreter and the directory of each library it links
  (``ldd``, once per binary), each at its own path;
* the local repository's directory and restic's cache directory, read-write;
* the password file: restic reads it through ``--password-file``; the password is never
  in the helper's environment, command line or log, nor in an error;
* ``/etc/ssl/certs`` for an S3 repository (TLS), and a tmpfs at ``/tmp`` (restic's
  temporary pack files).

A local repository's helper has no network; an S3 one's joins the host's network (so a
loopback endpoint works) and gets the repository's ``AWS_*`` environment, which the
engine shows in the helper's inspect data while it lives.

What restic 0.14.0 does here (measured; Debian 12, Podman 4.3):

* Parent: without ``--parent`` restic compares against the latest snapshot with the same
  host and paths. Every helper snapshot's path is ``/data``, so under a host name
  shared by volumes that would be another volume's snapshot (correct, since a changed
  file is re-read, but slow and misleading). Hence the automatic choice is never used:
  a parent given is passed as ``--parent``; none means ``--force`` (every file read, as
  for a first snapshot).
* ``restore ID --target /`` with the volume at ``/data`` restores the volume root's own
  owner, mode and mtime (restic stores ``/data``'s metadata), set-id bits, symlinks
  (dangling too) with their mtimes, hard links, empty directories, FIFOs and device
  nodes: no fix-up of the root is needed. It prints no progress and no summary (JSON or
  not), so progress is told once, at the end, with ``stats --mode restore-size``.
* ``dump ID /data`` writes a tar whose entries are named ``data/...``, with no entry
  for ``/data`` itself; it writes every hard link as a full copy of the file, FIFOs
  and device nodes as empty regular files, and mtimes rounded to the nearest second.
  :func:`dump_as_volume_tar` mends all of that from the snapshot's own records. (restic
  keeps no sockets at all, as ``tar`` does not.)

A helper is labelled as ours (role ``restic`` and the volume it holds) and removed when
its run ends, failed or not. When the calling thread is interrupted by an exception
(``on_progress`` raising, say) restic gets SIGINT first, so that it drops its
repository lock, then the helper is removed. A helper cannot die with this process: a
server killed mid-run leaves its helper running to its end (a backup then commits a
snapshot nobody records; the next prune of untracked snapshots reclaims it). The next
run on the same volume first removes any restic helper of ours holding it
(:func:`remove_restic_helpers`), which kills its restic and leaves its lock. The helper
shares this machine's PID namespace and host name for that reason: the lock then
names restic's real PID here, which ``restic unlock`` (so
:meth:`ResticRepository.recover_after_crash`, and every exclusive command's retry)
sees is gone and removes. (In its own namespaces restic would be PID 1 on a host named
after the container, a lock restic here keeps for 30 minutes, refusing ``check``,
``forget`` and ``prune`` meanwhile; measured.) Backups and restores take shared locks,
which a stale lock does not block.

One run per volume at a time: callers serialise them (a second run removes the first's
helper, see above).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import secrets
import socket
import struct
import subprocess
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import docker.errors

from gpuyard.core.errors import RuntimeFailure
from gpuyard.core.ownership import LABEL_INSTALLATION, LABEL_MANAGED
from gpuyard.runtimes.engine import Engine
from gpuyard.runtimes.engine_url import is_local_engine
from gpuyard.runtimes.helper_image import (
    ensure_helper_image,
    forget_helper_image,
    helper_image_name,
)
from gpuyard.runtimes.volume_copy import (
    LABEL_HELPER_VOLUME,
    LABEL_ROLE,
    MOUNT,
    remove_helpers,
    socket_reader,
    volume_labels,
)
from gpuyard.storage.restic import ResticInvocation, ResticRepository

# Marks our restic helpers (beside volume_copy's LABEL_HELPER_VOLUME: the volume held).
ROLE_RESTIC = "restic"
# How many of restic's last stderr lines an error carries.
STDERR_LINES = 20
# How often restic prints a progress line (RESTIC_PROGRESS_FPS).
PROGRESS_FPS = "2"
# How long a read of the helper's output waits before it asks whether the helper runs.
POLL_S = 30.0
# How long restic gets after SIGINT to drop its lock before the helper is removed.
STOP_GRACE_S = 5.0
# The exit status reported for a helper removed before restic ended.
HELPER_GONE = -1

Progress = Callable[[int], None]

_ID = re.compile(r"[0-9a-f]{8,64}")
_LDD_LIB = re.compile(r"\S+\s+=>\s+(\S+)\s+\(0x[0-9a-f]+\)")
_LDD_INTERP = re.compile(r"(/\S+)\s+\(0x[0-9a-f]+\)")
_CERTS = "/etc/ssl/certs"

_here_lock = threading.Lock()
_engines_here: weakref.WeakKeyDictionary[Engine, bool] = weakref.WeakKeyDictionary()


class ResticHelperFailed(RuntimeFailure):
    """restic in a helper exited with a non-zero status. ``details``: ``volume``,
    ``exit_status``, ``stderr`` (its last lines; never the password) and, for a backup
    that committed an incomplete snapshot (exit status 3), ``short_id``."""


@dataclass(frozen=True)
class HelperBackup:
    """A snapshot a helper committed: ``files`` and ``bytes`` are what restic processed
    (every file of the volume, read or found unchanged), ``data_added`` what the
    repository grew by, ``files_new``/``files_changed``/``files_unmodified`` how restic
    judged them against the parent, ``seconds`` the whole run, helper included."""

    restic_id: str
    files: int
    bytes: int
    data_added: int
    seconds: float
    files_new: int = 0
    files_changed: int = 0
    files_unmodified: int = 0


# -- where it can run ------------------------------------------------------------------


def helper_restic_available(engine: Engine, repository: ResticRepository) -> bool:
    """True only when a helper on ``engine`` can run this machine's restic against
    ``repository``: the engine runs on this machine (a ``unix://`` socket, or None with
    ``DOCKER_HOST`` unset or ``unix://``; not a socket forwarded by ssh, and the engine
    reports this machine's host name), restic is installed here and its libraries are
    found, the helper image can be built, and the repository is a local directory or
    ``s3:``. Never raises; asks the engine once per engine object."""
    if not repository.is_local and not repository.location.startswith("s3:"):
        return False
    try:
        invocation = repository.invocation([])
        paths = [
            invocation.password_file,
            invocation.cache_dir,
            *(p for bind in _runtime_binds(invocation.binary) for p in bind),
        ]
        if invocation.repository_dir is not None:
            paths.append(invocation.repository_dir)
        helper_image_name()
    except (RuntimeFailure, OSError):
        return False
    if any(":" in p for p in paths):  # a bind is written "source:target:mode"
        return False
    return _engine_is_here(engine)


def _engine_is_here(engine: Engine) -> bool:
    if not is_local_engine(engine.base_url):
        return False
    with _here_lock:
        known = _engines_here.get(engine)
    if known is not None:
        return known
    url = engine.base_url or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    if _served_by_ssh(url.removeprefix("unix://")):
        here = False
    else:
        try:
            with engine.errors("asking the engine for its host name"):
                info = engine.api.info() or {}
        except RuntimeFailure:
            return False  # not cached: it may answer later
        here = str(info.get("Name") or "") == socket.gethostname()
    with _here_lock:
        _engines_here[engine] = here
    return here


def _served_by_ssh(path: str) -> bool:
    """Whether the unix socket ``path`` is served by ssh (a forwarded remote engine,
    runtimes/ssh_tunnel.py). False when that cannot be told."""
    with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(2.0)
        sock.connect(path)
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        pid = struct.unpack("3i", creds)[0]
        return pid > 0 and os.path.basename(os.readlink(f"/proc/{pid}/exe")) == "ssh"
    return False


def _runtime_binds(binary: str) -> tuple[tuple[str, str], ...]:
    """(source here, path in the helper) for restic's binary, its interpreter and its
    libraries' directories. Raises RuntimeFailure when ldd cannot resolve them."""
    return _ldd_binds(binary, os.stat(binary).st_mtime_ns)


@functools.lru_cache(maxsize=4)
def _ldd_binds(binary: str, _mtime_ns: int) -> tuple[tuple[str, str], ...]:
    try:
        done = subprocess.run(["ldd", binary], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        raise RuntimeFailure(f"cannot list the libraries of {binary}: {exc}") from exc
    said = done.stdout + done.stderr
    binds: dict[str, str] = {binary: os.path.realpath(binary)}
    if "not a dynamic executable" in said or "statically linked" in said:
        return tuple((source, target) for target, source in binds.items())
    if done.returncode != 0 or "not found" in said:
        raise RuntimeFailure(f"cannot list the libraries of {binary}: {said.strip()[-300:]}")
    for line in done.stdout.splitlines():
        line = line.strip()
        if lib := _LDD_LIB.fullmatch(line):
            directory = os.path.dirname(lib.group(1))
            binds.setdefault(directory, os.path.realpath(directory))
        elif interpreter := _LDD_INTERP.fullmatch(line):
            binds.setdefault(interpreter.group(1), os.path.realpath(interpreter.group(1)))
    return tuple((source, target) for target, source in binds.items())


# -- backup and restore ----------------------------------------------------------------


def backup_volume(
    engine: Engine,
    volume: str,
    repository: ResticRepository,
    *,
    tags: Sequence[str],
    host: str,
    parent: str | None,
    on_progress: Progress | None = None,
) -> HelperBackup:
    """Snapshot our volume ``volume`` on ``engine`` (a local engine: see
    :func:`helper_restic_available`) into ``repository``: a helper with the volume
    read-only at ``/data`` runs ``restic backup /data`` with ``host`` and ``tags``.

    ``parent``: the snapshot of this volume to compare against (``--parent``): files
    unchanged since it (size, mtime, inode, ctime) are not read again. None reads every
    file (``--force``); restic's own choice of a parent is never used (see the module
    docstring). ``on_progress`` gets the bytes restic has processed so far, about twice
    a second, and the total at the end. The snapshot records owners (numeric), modes,
    mtimes, symlinks, hard links, empty directories, FIFOs and device nodes.

    Raises VolumeCopyFailed when the volume is missing or not ours, ResticError when
    the repository cannot be prepared, ResticHelperFailed when restic fails (exit status
    3: an incomplete snapshot was committed; its short id is in the details),
    RuntimeFailure when the engine fails, ValueError for a bad tag, host or parent."""
    _check_tags(tags)
    if not host or host.startswith("-") or "," in host:
        raise ValueError(f"invalid restic host {host!r}")
    if parent is not None:
        check_id(parent)
    began = time.monotonic()
    volume_labels(engine, volume)
    repository.ensure()
    args = ["backup", MOUNT, "--json", f"--host={host}", *(f"--tag={t}" for t in tags)]
    args.append(f"--parent={parent}" if parent is not None else "--force")
    summary: dict[str, Any] = {}
    told = -1

    def on_stdout(doc: dict[str, Any]) -> None:
        nonlocal told
        kind = doc.get("message_type")
        if kind == "summary":
            summary.update(doc)
        elif kind == "status" and on_progress is not None:
            done = int(doc.get("bytes_done") or 0)
            if done != told:
                told = done
                on_progress(done)

    with engine.errors(f"preparing the snapshot of volume {volume}"):
        remove_restic_helpers(engine, volume)  # left by a run that died mid-way
    code, stderr = _run_helper(
        engine, volume, repository, args, role="bak", read_only=True, on_stdout=on_stdout
    )
    short_id = summary.get("snapshot_id")
    if code != 0 or not isinstance(short_id, str):
        _raise_failure("backup", engine, volume, code, stderr, short_id=short_id)
    total = int(summary.get("total_bytes_processed") or 0)
    if on_progress is not None and total != told:
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


def restore_volume(
    engine: Engine,
    target_volume: str,
    labels: Mapping[str, str],
    repository: ResticRepository,
    restic_id: str,
    *,
    on_progress: Progress | None = None,
) -> int:
    """Make ``target_volume`` on ``engine`` anew (ours, with ``labels`` but ours for
    ownership; an existing one, and any helper of ours holding it, is removed first)
    and restore snapshot ``restic_id`` (taken by :func:`backup_volume`) into it: a helper
    with the volume at ``/data`` runs ``restic restore ID --target /``. The volume root
    gets the snapshot's owner, mode and mtime. Returns the bytes of file contents
    restored (each hard-linked file once); ``on_progress`` gets that once, at the end
    (restic 0.14's restore reports no progress).

    The snapshot is checked before the target is touched: one that does not exist or
    was not taken by :func:`backup_volume` raises ResticError or RuntimeFailure and
    leaves the target as it was. A failed restore (ResticHelperFailed, RuntimeFailure)
    may leave a partial target: restore into a volume nobody uses yet and swap it in."""
    check_id(restic_id)
    snapshot = repository.cat_json("snapshot", restic_id)
    paths = snapshot.get("paths") if isinstance(snapshot, dict) else None
    if paths != [MOUNT]:
        raise RuntimeFailure(
            f"snapshot {restic_id[:8]} holds {paths}, not a volume taken by a restic helper",
            {"restic_id": restic_id, "paths": paths},
        )
    size, _entries = repository.restore_size(restic_id)
    carried = {k: v for k, v in labels.items() if k not in (LABEL_INSTALLATION, LABEL_MANAGED)}
    with engine.errors(f"preparing volume {target_volume}"):
        remove_restic_helpers(engine, target_volume)
        remove_helpers(engine, target_volume)
        engine.remove_volume(target_volume)
        engine.ensure_volume(target_volume, carried)
    code, stderr = _run_helper(
        engine,
        target_volume,
        repository,
        ["restore", restic_id, "--target=/"],
        role="rst",
        read_only=False,
        on_stdout=lambda doc: None,
    )
    if code != 0:
        _raise_failure("restore", engine, target_volume, code, stderr)
    if on_progress is not None:
        on_progress(size)
    return size


def remove_restic_helpers(engine: Engine, volume: str | None = None) -> list[str]:
    """Remove our restic helpers (those holding ``volume`` only, when given), running or
    not; their restic is killed. Returns their names."""
    return remove_helpers(engine, volume, role=ROLE_RESTIC)


def _raise_failure(
    command: str, engine: Engine, volume: str, code: int, stderr: str, short_id: Any = None
) -> NoReturn:
    lines = [line for line in stderr.splitlines() if line.strip()]
    last = lines[-1] if lines else "restic said nothing"
    details: dict[str, Any] = {"volume": volume, "exit_status": code, "stderr": stderr}
    if isinstance(short_id, str):
        details["short_id"] = short_id
    if code == HELPER_GONE:
        what = "its helper was removed before restic finished"
    else:
        what = f"exit status {code}" if code != 0 else "no snapshot reported"
    raise ResticHelperFailed(
        f"restic {command} of volume {volume} on {engine.where} failed ({what}): {last[-500:]}",
        details,
    )


def _run_helper(
    engine: Engine,
    volume: str,
    repository: ResticRepository,
    args: Sequence[str],
    *,
    role: str,
    read_only: bool,
    on_stdout: Callable[[dict[str, Any]], None],
) -> tuple[int, str]:
    """Run ``restic args`` in a new helper holding ``volume``; each JSON object restic
    prints on stdout goes to ``on_stdout``. Returns (exit status, last stderr lines,
    redacted). The helper is removed in every case; an exception (from ``on_stdout``,
    say) interrupts restic first."""
    invocation = repository.invocation(args)
    action = f"running restic on volume {volume}"
    with engine.errors(action):
        name = _create_helper(
            engine, volume, invocation, role=role, read_only=read_only,
            host_network=not repository.is_local,
        )  # fmt: skip
    stderr: deque[str] = deque(maxlen=STDERR_LINES)

    def on_line(kind: int, line: bytes) -> None:
        if kind == 2:
            stderr.append(line.decode("utf-8", "replace").rstrip())
        elif line.startswith(b"{"):
            try:
                doc = json.loads(line)
            except ValueError:
                return
            if isinstance(doc, dict):
                on_stdout(doc)

    try:
        with engine.errors(action):
            # Attached before the start, so not a line is missed.
            sock = engine.api.attach_socket(name, params={"stdout": 1, "stderr": 1, "stream": 1})
        try:
            with engine.errors(action):
                engine.api.start(name)
            _pump(engine, name, sock, on_line)
            code = _exit_status(engine, name)
        finally:
            with contextlib.suppress(OSError):
                sock.close()
    except BaseException:
        _interrupt(engine, name)
        raise
    finally:
        with contextlib.suppress(RuntimeFailure):
            engine.remove_container(name)
    return code, repository.redact("\n".join(stderr))


def _exit_status(engine: Engine, name: str) -> int:
    """The exit status of the helper whose output just ended (Podman 4.3 answers its
    wait 0.1 to 0.5 s after that; its inspect still says "running" meanwhile).
    HELPER_GONE when the helper was removed meanwhile (by another run's clean-up)."""
    with engine.errors(f"waiting for helper {name}"):
        try:
            status = engine.api.wait(name, timeout=engine.timeout_s)
        except docker.errors.NotFound:
            return HELPER_GONE
    code = status.get("StatusCode") if isinstance(status, dict) else status
    return int(code) if code is not None else HELPER_GONE


def _create_helper(
    engine: Engine,
    volume: str,
    invocation: ResticInvocation,
    *,
    role: str,
    read_only: bool,
    host_network: bool,
) -> str:
    image = ensure_helper_image(engine)
    name = f"{engine.owner.prefix}-rs-{secrets.token_hex(4)}-{role}"
    binds = [f"{volume}:{MOUNT}:{'ro' if read_only else 'rw'}"]
    binds += [f"{source}:{target}:ro" for source, target in _runtime_binds(invocation.binary)]
    if invocation.repository_dir is not None:
        binds.append(f"{invocation.repository_dir}:{invocation.repository_dir}:rw")
    binds.append(f"{invocation.cache_dir}:{invocation.cache_dir}:rw")
    binds.append(f"{invocation.password_file}:{invocation.password_file}:ro")
    if host_network and os.path.isdir(_CERTS):
        binds.append(f"{_CERTS}:{_CERTS}:ro")
    kwargs: dict[str, Any] = {
        "command": list(invocation.argv),
        "name": name,
        "labels": engine.labels({LABEL_ROLE: ROLE_RESTIC, LABEL_HELPER_VOLUME: volume}),
        "environment": {**invocation.env, "TMPDIR": "/tmp", "RESTIC_PROGRESS_FPS": PROGRESS_FPS},
        "network_disabled": not host_network,
        # restic's repository lock names its host and PID: this machine's, so that once
        # the helper is gone restic here sees the lock as stale (`unlock` removes it).
        # (The host network shares the host's name already.)
        **({} if host_network else {"hostname": socket.gethostname()}),
        "host_config": engine.api.create_host_config(
            binds=binds,
            network_mode="host" if host_network else "none",
            pid_mode="host",
            tmpfs={"/tmp": ""},
            # Restoring device nodes needs mknod (Podman does not grant it by default).
            cap_add=None if read_only else ["MKNOD"],
            # restic's output comes through the attach stream; nothing is kept.
            log_config={"Type": "none", "Config": {}},
        ),
    }
    try:
        engine.api.create_container(image, **kwargs)
    except docker.errors.ImageNotFound:
        forget_helper_image(engine)  # removed behind our back: import it again
        engine.api.create_container(ensure_helper_image(engine), **kwargs)
    return name


def _pump(engine: Engine, name: str, sock: Any, on_line: Callable[[int, bytes], None]) -> None:
    """Read the helper's multiplexed attach stream to its end, handing each complete
    line to ``on_line`` with its stream (1 stdout, 2 stderr). A read that waits longer
    than POLL_S asks whether the helper still runs (restic's restore prints nothing
    for as long as it works)."""
    raw = getattr(sock, "_sock", sock)
    if isinstance(raw, socket.socket):
        raw.settimeout(POLL_S)
        readinto: Callable[[memoryview], int] = raw.recv_into
    else:
        readinto = socket_reader(sock)
    view = memoryview(bytearray(1 << 16))
    pending = bytearray()
    partial: dict[int, bytearray] = {}
    while True:
        try:
            n = readinto(view)
        except TimeoutError:
            with engine.errors(f"watching helper {name}"):
                state = (engine.api.inspect_container(name).get("State") or {}).get("Running")
            if state:
                continue
            break
        if n == 0:
            break
        pending += view[:n]
        pos = 0
        while len(pending) - pos >= 8:
            kind, size = pending[pos], int.from_bytes(pending[pos + 4 : pos + 8], "big")
            if len(pending) - pos - 8 < size:
                break
            buf = partial.setdefault(kind, bytearray())
            buf += pending[pos + 8 : pos + 8 + size]
            pos += 8 + size
            *lines, rest = buf.split(b"\n")
            for line in lines:
                on_line(kind, bytes(line))
            partial[kind] = rest
        del pending[:pos]
    for kind, rest in partial.items():
        if rest.strip():
            on_line(kind, bytes(rest))


def _interrupt(engine: Engine, name: str) -> None:
    """SIGINT to restic (it then removes its lock; 0.14 cleans up on SIGINT only), and
    a few seconds for it to go; the helper's removal kills it otherwise."""
    with contextlib.suppress(Exception):
        engine.api.kill(name, signal="SIGINT")
        engine.api.wait(name, timeout=STOP_GRACE_S)


def _check_tags(tags: Sequence[str]) -> None:
    for tag in tags:
        if not tag or "," in tag:  # restic splits a --tag value at commas
            raise ValueError(f"invalid restic tag {tag!r}: must be non-empty, without commas")


def check_id(restic_id: str) -> None:
    """ValueError unless ``restic_id`` looks like a restic snapshot id."""
    if not _ID.fullmatch(restic_id):
        raise ValueError(f"invalid restic snapshot id {restic_id!r}")
