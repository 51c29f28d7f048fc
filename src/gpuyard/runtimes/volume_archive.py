"""A volume as a tar stream, read from or written to any runtime: what snapshots save
and restore.

Real engines go through their archive API (runtimes/volume_copy.py: a short-lived
helper container of ours mounts the volume; the user's container is never entered),
which works the same for a remote host over SSH. The in-memory runtime turns its files
into a real tar and back, so snapshot logic is tested with the real repository and
without engines.
"""

from __future__ import annotations

import contextlib
import io
import tarfile
from collections.abc import Callable, Iterable, Iterator

from gpuyard.core.errors import RuntimeFailure
from gpuyard.core.ownership import LABEL_CLUSTER
from gpuyard.runtimes.base import Runtime
from gpuyard.runtimes.engine import Engine
from gpuyard.runtimes.engine_disk import with_size
from gpuyard.runtimes.fake import FakeRuntime
from gpuyard.runtimes.volume_copy import (
    Chunk,
    fill_volume,
    volume_labels,
    volume_tar_stream,
)

Progress = Callable[[int], None]


def engine_of(runtime: Runtime) -> Engine | None:
    """The Docker-API engine behind ``runtime``; None for other runtimes."""
    engine = getattr(runtime, "engine", None)
    return engine if isinstance(engine, Engine) else None


@contextlib.contextmanager
def read_volume(runtime: Runtime, volume: str) -> Iterator[Iterator[Chunk]]:
    """The tar stream of our volume ``volume`` on ``runtime``'s engine (entries named
    ``./...``, the root as ``.``). The iterator raises RuntimeFailure after its last
    chunk when the stream was cut short or tar failed, so a consumer never takes a
    partial stream for a whole one. Raises RuntimeFailure when the volume is missing
    or the engine does not answer."""
    engine = engine_of(runtime)
    if engine is not None:
        with volume_tar_stream(engine, volume) as chunks:
            yield chunks
        return
    if isinstance(runtime, FakeRuntime):
        if runtime.unavailable:
            raise RuntimeFailure(f"engine unreachable: {runtime.unavailable}")
        try:
            files = runtime.volume_files(volume)
        except KeyError as exc:
            raise RuntimeFailure(f"volume {volume} not found", {"volume": volume}) from exc
        yield iter([_tar_of(files)])
        return
    raise RuntimeFailure(f"a {runtime.name} engine cannot read volumes")


def write_volume(
    runtime: Runtime,
    volume: str,
    cluster_id: str | None,
    chunks: Iterable[Chunk],
    *,
    like: str | None = None,
    on_progress: Progress | None = None,
    size_gb: int = 0,
) -> int:
    """Make ``volume`` anew on ``runtime``'s engine (an existing one of ours is removed
    first) and unpack the tar stream ``chunks`` into it, byte for byte: contents,
    owners, modes, mtimes, symlinks, hard links, empty directories and the root's own
    metadata. Its labels are those of our volume ``like`` (the volume it replaces), or
    ours for ``cluster_id``. Returns the stream's length. An exception raised by
    ``chunks`` is raised again as it was; an engine failure raises RuntimeFailure; the
    volume may then be partial (callers write into a volume nobody uses yet).
    ``size_gb``: the size it is held to (at least; a larger one ``like`` has is kept)."""
    engine = engine_of(runtime)
    if engine is not None:
        labels: dict[str, str] = {}
        if like is not None:
            with contextlib.suppress(RuntimeFailure):
                labels = volume_labels(engine, like)
        if not labels:
            labels = engine.labels({LABEL_CLUSTER: cluster_id} if cluster_id else {})
        labels = with_size(labels, size_gb)
        return fill_volume(engine, volume, labels, chunks, on_progress=on_progress)
    if isinstance(runtime, FakeRuntime):
        if runtime.unavailable:
            raise RuntimeFailure(f"engine unreachable: {runtime.unavailable}")
        data = b"".join(bytes(c) for c in chunks)
        runtime.remove_volume(volume)
        runtime.ensure_volume(volume, cluster_id, size_gb or None)
        runtime.replace_volume_files(volume, _files_of(data))
        if on_progress is not None:
            on_progress(len(data))
        return len(data)
    raise RuntimeFailure(f"a {runtime.name} engine cannot write volumes")


def _tar_of(files: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        root = tarfile.TarInfo(".")
        root.type = tarfile.DIRTYPE
        root.mode = 0o755
        tar.addfile(root)
        for name in sorted(files):
            content = files[name].encode()
            info = tarfile.TarInfo(f"./{name}")
            info.size = len(content)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(content))
    return buf.getvalue()


def _files_of(data: bytes) -> dict[str, str]:
    files: dict[str, str] = {}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        for member in tar:
            if member.isreg():
                reader = tar.extractfile(member)
                assert reader is not None
                name = member.name[2:] if member.name.startswith("./") else member.name
                files[name] = reader.read().decode()
    return files
