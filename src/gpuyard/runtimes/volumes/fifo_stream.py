"""A volume's tar read through a FIFO, for an engine on this machine.

The reader is the helper :func:`~gpuyard.runtimes.volumes.copy.volume_tar_stream` makes
(our busybox; the volume alone, read-only, at MOUNT; no network; its own PID namespace)
with one more mount: a fresh directory of ours (0700) that holds nothing but a FIFO, at
OUT. ``tar c -f OUT/stream`` writes into it and this process reads the other end, so
the bytes never pass through the engine's attach stream (where the engine's service
and this process copied and framed every byte: most of a snapshot's time after the
first, measured with ``bench/bench_snapshot.py``).

Only a stream leaves the volume, as before: what the helper can reach is the volume
(read-only) and that directory; the FIFO is opened with ``O_NOFOLLOW`` and checked to be
a FIFO, so a helper that swapped it for a link could not make us read another file.

An engine on another machine cannot mount the directory: the bind is a ``Mounts``
entry, which the engine refuses when its source does not exist there (the legacy
``Binds`` would create it), and :class:`NotHere` is raised before anything runs. A
stream that ends before its first byte (no tar has fewer than 1,024) raises
:class:`NotHere` too, so an engine that somehow wrote elsewhere never passes for an
empty volume.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import shutil
import stat
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker.errors
import docker.types
import requests

from gpuyard.core.errors import RuntimeFailure
from gpuyard.runtimes.engines.engine import Engine
from gpuyard.runtimes.engines.helper_image import ensure_helper_image
from gpuyard.runtimes.volumes.copy import (
    DEFAULT_CHUNK_SIZE,
    LABEL_HELPER_VOLUME,
    LABEL_ROLE,
    MOUNT,
    ROLE_VOLUME_COPY,
    VolumeCopyFailed,
    _volume_labels,
    remove_helpers,
)

OUT = "/out"
FIFO = "stream"
# A pipe of this size needs fewer, larger reads than the default 64 KiB.
_PIPE_SIZE = 1 << 20


class NotHere(Exception):
    """The engine cannot share a directory with this process (it runs elsewhere):
    read the volume through its attach stream instead. Nothing was read."""


@contextlib.contextmanager
def volume_tar_fifo(
    engine: Engine, volume: str, *, chunk_size: int = DEFAULT_CHUNK_SIZE
) -> Iterator[Iterator[bytes]]:
    """The same stream as :func:`~gpuyard.runtimes.volumes.copy.volume_tar_stream`,
    read through a FIFO this process shares with the engine. Raises NotHere (before
    yielding) when the engine cannot share it; VolumeCopyFailed (source side) for a
    volume that is missing or not ours, and, after the last chunk, when tar failed.
    The helper and the directory are removed on exit."""
    _volume_labels(engine, volume)
    remove_helpers(engine, volume)  # left by a reader that died mid-way
    work = Path(tempfile.mkdtemp(prefix="gy-tar-"))  # 0700
    fifo = work / FIFO
    os.mkfifo(fifo, 0o600)
    name = f"{engine.owner.prefix}-mv-{secrets.token_hex(4)}-src"
    try:
        _create(engine, volume, name, work)
        engine.api.start(name)
        status: dict[str, Any] = {}
        opened = threading.Event()
        watcher = threading.Thread(
            target=_watch, args=(engine, name, fifo, status, opened), daemon=True
        )
        watcher.start()
        try:
            fd = os.open(fifo, os.O_RDONLY | os.O_NOFOLLOW)
        finally:
            opened.set()
        try:
            if not stat.S_ISFIFO(os.fstat(fd).st_mode):
                raise VolumeCopyFailed(
                    f"the stream of volume {volume} is not a FIFO", side="source"
                )
            with contextlib.suppress(OSError):
                fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, _PIPE_SIZE)
            first = os.read(fd, chunk_size)
            if not first:
                watcher.join()
                if status.get("StatusCode") == 0:
                    raise NotHere(f"the engine at {engine.where} wrote its tar elsewhere")
                raise _failed(engine, volume, status)
            yield _chunks(fd, first, chunk_size, watcher, status, engine, volume)
        finally:
            os.close(fd)
    finally:
        with contextlib.suppress(RuntimeFailure):
            engine.remove_container(name)
        shutil.rmtree(work, ignore_errors=True)


def _create(engine: Engine, volume: str, name: str, work: Path) -> None:
    kwargs: dict[str, Any] = {
        "command": ["tar", "c", "-f", f"{OUT}/{FIFO}", "-C", MOUNT, "."],
        "name": name,
        "labels": engine.labels({LABEL_ROLE: ROLE_VOLUME_COPY, LABEL_HELPER_VOLUME: volume}),
        "network_disabled": True,
        "host_config": engine.api.create_host_config(
            binds={volume: {"bind": MOUNT, "mode": "ro"}},
            mounts=[docker.types.Mount(OUT, str(work), type="bind")],
            network_mode="none",
            log_config={"Type": "none", "Config": {}},
        ),
    }
    try:
        engine.api.create_container(ensure_helper_image(engine), **kwargs)
    except docker.errors.APIError as exc:
        # Any refusal of the create: the attach stream is always safe to fall back to.
        raise NotHere(f"the engine at {engine.where} cannot mount {work}: {exc}") from exc


def _watch(
    engine: Engine, name: str, fifo: Path, status: dict[str, Any], opened: threading.Event
) -> None:
    """Wait for the helper to end (however long its tar runs), then let a reader still
    blocked in ``open`` go (a helper that died before it opened the FIFO): a writer's
    open and close of our own end the stream it waits for."""
    while True:
        try:
            answer = engine.api.wait(name, timeout=engine.timeout_s)
        except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
            continue  # still running: a large volume's tar outlasts one wait
        except Exception as exc:  # reported as the helper's failure
            status["error"] = str(exc)
            break
        status.update(answer if isinstance(answer, dict) else {"StatusCode": answer})
        break
    while not opened.is_set():
        try:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW))
            return
        except OSError:  # ENXIO: the reader is not in open() yet
            opened.wait(0.05)


def _chunks(
    fd: int,
    first: bytes,
    chunk_size: int,
    watcher: threading.Thread,
    status: dict[str, Any],
    engine: Engine,
    volume: str,
) -> Iterator[bytes]:
    yield first
    while data := os.read(fd, chunk_size):
        yield data
    watcher.join()
    if status.get("StatusCode") != 0:
        raise _failed(engine, volume, status)


def _failed(engine: Engine, volume: str, status: dict[str, Any]) -> VolumeCopyFailed:
    code = status.get("StatusCode")
    return VolumeCopyFailed(
        f"tar of volume {volume} on {engine.where} failed (exit {code})"
        + (f": {status['error']}" if "error" in status else ""),
        side="source",
        details={"volume": volume, "exit_code": code},
    )
