"""restic run in a helper container beside ONE volume, for an engine on this machine.

The helper (runtimes/engines/restic_image.py: busybox, restic and its libraries) has:

* the volume at ``/data``, read-only for a backup, read-write for a restore;
* a fresh directory of ours (0700) at ``/gy``, which holds only what this run writes
  there: the repository's URL and the password of the operation's one-time key (written
  just before restic starts, never in the container's command or environment), a
  ``go`` file, and restic's output, exit status and stderr;
* a tmpfs at ``/tmp`` (restic's temporary packs), and no network: only the loopback
  interface of its own network namespace. The caller's REST backend server listens on
  that interface (it enters the namespace: :attr:`HelperRun.netns_fd`), so restic can
  reach the repository, and nothing else on any network can reach that server.

Nothing of the repository, the server's home or the host's secrets is in the helper's
file system, so a tenant's symlink in the volume (to the repository's path, to ``/etc``,
to ``/gy``), followed or not, leads only to the helper's own files.

The helper waits for ``/gy/go`` before it runs restic, because the server can only
listen once the helper's namespace exists. The namespace is opened through
``/proc/<pid>/ns/net`` and accepted only when ``/proc/<pid>/root/gy`` is our directory
(same device and inode): an engine elsewhere, or a PID reused meanwhile, raises
:class:`~gpuyard.runtimes.volumes.fifo_stream.NotHere` before anything ran, as does an
engine that refuses the bind (a remote one: the directory does not exist there).
The helper is removed on exit, which kills a restic still running.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Final

import docker.errors
import docker.types

from gpuyard.core.errors import RuntimeFailure
from gpuyard.runtimes.engines.engine import Engine
from gpuyard.runtimes.engines.restic_image import (
    RESTIC_IN_IMAGE,
    ensure_restic_image,
    forget_restic_image,
)
from gpuyard.runtimes.engines.url import is_local_engine
from gpuyard.runtimes.volumes.copy import (
    LABEL_HELPER_VOLUME,
    LABEL_ROLE,
    MOUNT,
    remove_helpers,
    volume_labels,
)
from gpuyard.runtimes.volumes.fifo_stream import NotHere

ROLE_RESTIC_HELPER: Final = "restic-helper"
WORK: Final = "/gy"
# How often the run's files are looked at while restic works.
POLL_S: Final = 0.02
# How often the engine is asked whether the helper still runs.
ENGINE_POLL_S: Final = 2.0
# HelperRun.wait's status when what restic reaches the repository through ended first.
SERVER_GONE: Final = -2
STDERR_LINES: Final = 20
# restic's progress lines per second (RESTIC_PROGRESS_FPS).
PROGRESS_FPS: Final = "2"
_SCRIPT: Final = (
    f"while [ ! -e {WORK}/go ]; do usleep 10000; done; "
    f'{RESTIC_IN_IMAGE} "$@" >{WORK}/out 2>{WORK}/err; echo $? >{WORK}/rc.tmp; '
    f"mv {WORK}/rc.tmp {WORK}/rc"
)


@dataclass
class HelperResult:
    """How restic in the helper ended: its exit status (-1: the helper ended without
    one), its last JSON ``summary`` line, and its last stderr lines."""

    exit_status: int
    summary: dict[str, Any] | None
    stderr: str
    seconds: float = 0.0


@dataclass
class HelperRun:
    """A started helper waiting for :meth:`go`. ``netns_fd``: its network namespace,
    open (closed on exit)."""

    engine: Engine
    name: str
    work: Path
    netns_fd: int
    _began: float = field(default_factory=time.monotonic)

    def go(self, files: Mapping[str, bytes]) -> None:
        """Write ``files`` (name -> content, 0600) into ``/gy`` and let restic run."""
        for name, content in {**files, "go": b""}.items():
            fd = os.open(self.work / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(content)

    def wait(
        self,
        on_json: Callable[[dict[str, Any]], None] | None = None,
        *,
        serving: Callable[[], bool] | None = None,
    ) -> HelperResult:
        """Wait for restic to end, handing each JSON line it prints to ``on_json``.
        Ends early with status -1 when the helper is gone, and -2 when ``serving``
        (what restic reaches the repository through) says False: restic would retry
        a dead repository for many minutes."""
        out = self.work / "out"
        rc = self.work / "rc"
        summary: dict[str, Any] | None = None
        offset = 0
        partial = b""
        next_engine_check = time.monotonic() + ENGINE_POLL_S
        while True:
            done = rc.exists()
            with contextlib.suppress(FileNotFoundError), _open_ours(out) as f:
                f.seek(offset)
                data = f.read()
                offset += len(data)
                *lines, partial = (partial + data).split(b"\n")
                for line in lines:
                    doc = _json_line(line)
                    if doc is None:
                        continue
                    if doc.get("message_type") == "summary":
                        summary = doc
                    if on_json is not None:
                        on_json(doc)
            if done:
                status = _read_status(rc)
                break
            if serving is not None and not serving() and not rc.exists():
                status = SERVER_GONE
                break
            if time.monotonic() >= next_engine_check:
                next_engine_check = time.monotonic() + ENGINE_POLL_S
                if not self._running() and not rc.exists():
                    status = -1
                    break
            time.sleep(POLL_S)
        if partial:
            doc = _json_line(partial)
            if doc is not None and doc.get("message_type") == "summary":
                summary = doc
        return HelperResult(status, summary, self._stderr(), time.monotonic() - self._began)

    def _running(self) -> bool:
        with self.engine.errors(f"watching helper {self.name}"):
            try:
                info = self.engine.api.inspect_container(self.name)
            except docker.errors.NotFound:
                return False
        return bool((info.get("State") or {}).get("Running"))

    def _stderr(self) -> str:
        tail: deque[str] = deque(maxlen=STDERR_LINES)
        with contextlib.suppress(OSError), _open_ours(self.work / "err") as f:
            for line in f:
                if line.strip():
                    tail.append(line.decode("utf-8", "replace").rstrip())
        return "\n".join(tail)


def can_run_here(engine: Engine) -> bool:
    """Whether a restic helper may be tried on ``engine``: one reached through a unix
    socket of this machine (the run still checks that the helper is here)."""
    return is_local_engine(engine.base_url)


@contextlib.contextmanager
def restic_helper(
    engine: Engine,
    volume: str,
    args: Sequence[str],
    *,
    binary: str,
    read_only: bool,
) -> Iterator[HelperRun]:
    """A started helper on ``engine`` with our volume ``volume`` at ``/data`` that will
    run ``restic args`` once told to (:meth:`HelperRun.go`); the repository comes from
    ``/gy/repo`` and the password from ``/gy/pw``, both written by ``go``. Raises NotHere
    (nothing ran) where the engine cannot run it beside this process; RuntimeFailure
    when the engine fails. Removed on exit (restic with it, if still running)."""
    if not can_run_here(engine):
        raise NotHere(f"the engine at {engine.where} is not on this machine")
    remove_helpers(engine, volume, role=ROLE_RESTIC_HELPER)  # left by a run that died
    work = Path(tempfile.mkdtemp(prefix="gy-restic-"))  # 0700
    name = f"{engine.owner.prefix}-rh-{secrets.token_hex(4)}"
    fd: int | None = None
    try:
        _create(engine, volume, name, work, args, binary=binary, read_only=read_only)
        # The engine makes a named volume that is missing: one removed since the caller
        # checked it would be snapshotted (or restored into) as an empty one. Ours, or
        # VolumeCopyFailed.
        volume_labels(engine, volume)
        with engine.errors(f"starting the restic helper of volume {volume}"):
            engine.api.start(name)
            info = engine.api.inspect_container(name)
        fd = _open_netns(info, work)
        yield HelperRun(engine, name, work, fd)
    finally:
        if fd is not None:
            os.close(fd)
        with contextlib.suppress(RuntimeFailure):
            engine.remove_container(name)
        shutil.rmtree(work, ignore_errors=True)


def remove_restic_helpers(engine: Engine, volume: str) -> None:
    """Remove our restic helpers holding ``volume`` (their restic is killed)."""
    remove_helpers(engine, volume, role=ROLE_RESTIC_HELPER)


def _create(
    engine: Engine,
    volume: str,
    name: str,
    work: Path,
    args: Sequence[str],
    *,
    binary: str,
    read_only: bool,
) -> None:
    image = helper_image(engine, binary)
    kwargs: dict[str, Any] = {
        "command": ["sh", "-c", _SCRIPT, "sh", *args],
        "name": name,
        "labels": engine.labels({LABEL_ROLE: ROLE_RESTIC_HELPER, LABEL_HELPER_VOLUME: volume}),
        "network_disabled": True,
        "environment": {
            "RESTIC_REPOSITORY_FILE": f"{WORK}/repo",
            "RESTIC_PASSWORD_FILE": f"{WORK}/pw",
            "RESTIC_PROGRESS_FPS": PROGRESS_FPS,
            "TMPDIR": "/tmp",
        },
        "host_config": engine.api.create_host_config(
            binds={volume: {"bind": MOUNT, "mode": "ro" if read_only else "rw"}},
            mounts=[docker.types.Mount(WORK, str(work), type="bind")],
            network_mode="none",
            tmpfs={"/tmp": "rw,size=1g,mode=1777"},
            # Restoring device nodes needs mknod (Podman does not grant it by default).
            cap_add=None if read_only else ["MKNOD"],
            log_config={"Type": "none", "Config": {}},
        ),
    }
    try:
        engine.api.create_container(image, **kwargs)
    except docker.errors.ImageNotFound:
        forget_restic_image(engine)  # removed behind our back: import it again
        engine.api.create_container(helper_image(engine, binary), **kwargs)
    except docker.errors.APIError as exc:
        raise NotHere(f"the engine at {engine.where} cannot mount {work}: {exc}") from exc


def helper_image(engine: Engine, binary: str) -> str:
    """The helper image for ``binary`` on ``engine``. NotHere when it cannot be made
    (a restic that is a script, libraries ldd cannot list): the operation streams."""
    try:
        return ensure_restic_image(engine, binary)
    except RuntimeFailure as exc:
        if engine.ping() is not None:
            raise  # the engine itself fails: so would the stream
        raise NotHere(f"no restic helper image: {exc.message}") from exc


def _open_netns(info: Mapping[str, Any], work: Path) -> int:
    """The helper's network namespace, open; NotHere unless the process the engine
    names is the helper with our directory, on this machine."""
    pid = int((info.get("State") or {}).get("Pid") or 0)
    if pid <= 0:
        raise NotHere("the engine names no process of the helper")
    try:
        fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise NotHere(f"the helper's process is not on this machine: {exc}") from exc
    try:
        # Checked after the open: a PID reused before it fails here.
        theirs = os.stat(f"/proc/{pid}/root{WORK}")
        ours = os.stat(work)
    except OSError as exc:
        os.close(fd)
        raise NotHere(f"the helper's process is not on this machine: {exc}") from exc
    if (theirs.st_dev, theirs.st_ino) != (ours.st_dev, ours.st_ino):
        os.close(fd)
        raise NotHere("the helper's process does not hold our directory")
    return fd


def _open_ours(path: Path) -> BinaryIO:
    """A file the helper wrote into our directory, never through a link it made."""
    return os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW), "rb")


def _read_status(rc: Path) -> int:
    try:
        with _open_ours(rc) as f:
            return int(f.read(32).strip())
    except (OSError, ValueError):
        return -1


def _json_line(line: bytes) -> dict[str, Any] | None:
    if not line.startswith(b"{"):
        return None
    try:
        doc = json.loads(line)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def failure(what: str, volume: str, engine: Engine, result: HelperResult) -> RuntimeFailure:
    """The error for a restic run in a helper that failed."""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    last = lines[-1] if lines else "restic said nothing"
    how = f"exit status {result.exit_status}" if result.exit_status >= 0 else "helper gone"
    return RuntimeFailure(
        f"restic {what} of volume {volume} on {engine.where} failed ({how}): {last[-500:]}",
        {"volume": volume, "exit_status": result.exit_status, "stderr": result.stderr},
    )
