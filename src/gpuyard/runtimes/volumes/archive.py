"""A volume as a tar stream, read from or written to any runtime: what snapshots save
and restore. Each runtime's :class:`~gpuyard.runtimes.capabilities.VolumeIO` does the
work: a real engine through its archive API (runtimes/engines/volumes.py), the in-memory
runtime by turning its files into a real tar and back, so snapshot logic is tested with
the real repository and without engines.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

from gpuyard.runtimes.base import Runtime
from gpuyard.runtimes.capabilities import Progress
from gpuyard.runtimes.records import Chunk


@contextlib.contextmanager
def read_volume(runtime: Runtime, volume: str) -> Iterator[Iterator[Chunk]]:
    """The tar stream of our volume ``volume`` on ``runtime``'s engine: see
    :meth:`VolumeIO.read <gpuyard.runtimes.capabilities.VolumeIO.read>`."""
    with runtime.volume_io().read(volume) as chunks:
        yield chunks


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
    """Make ``volume`` anew on ``runtime``'s engine and unpack the tar stream ``chunks``
    into it: see :meth:`VolumeIO.write <gpuyard.runtimes.capabilities.VolumeIO.write>`.
    Returns the stream's length."""
    return runtime.volume_io().write(
        volume, cluster_id, chunks, like=like, on_progress=on_progress, size_gb=size_gb
    )


def remove_volume_readers(runtime: Runtime, volume: str) -> None:
    """Remove what an interrupted read of ``volume`` on ``runtime`` left behind: see
    :meth:`VolumeIO.remove_readers
    <gpuyard.runtimes.capabilities.VolumeIO.remove_readers>`."""
    runtime.volume_io().remove_readers(volume)
