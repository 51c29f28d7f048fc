"""Volume I/O on a Docker-API engine (the :class:`~gpuyard.runtimes.capabilities.VolumeIO`
of runtimes/engines/runtime.py): tar streams read and written through the engine's
archive API by short-lived helper containers of ours (runtimes/volumes/copy.py), so the
user's container is never entered; this works the same for a remote host over SSH. A
volume of an engine on this machine is read through a FIFO shared with its helper
instead of the attach stream (runtimes/volumes/fifo_stream.py: the same bytes, without
the engine's copies), falling back to the attach stream where the engine cannot share it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping

from gpuyard.core.errors import RuntimeFailure
from gpuyard.core.ownership import LABEL_CLUSTER
from gpuyard.runtimes.capabilities import Progress, VolumeIO
from gpuyard.runtimes.engines.disk import with_size
from gpuyard.runtimes.engines.engine import Engine
from gpuyard.runtimes.engines.url import is_local_engine
from gpuyard.runtimes.records import Chunk
from gpuyard.runtimes.volumes.copy import (
    copy_volume,
    fill_volume,
    remove_helpers,
    volume_labels,
    volume_tar_stream,
)
from gpuyard.runtimes.volumes.fifo_stream import NotHere, volume_tar_fifo
from gpuyard.runtimes.volumes.restic_helper import remove_restic_helpers

# The helpers of earlier versions that ran restic beside a volume: removed on sight.
LEGACY_ROLE_RESTIC = "restic"


def target_labels(
    engine: Engine, like: str | None, cluster_id: str | None, size_gb: int = 0
) -> dict[str, str]:
    """The labels a volume written anew gets: those of our volume ``like`` when it
    exists, else ours naming ``cluster_id``; held to ``size_gb`` GiB at least."""
    labels: dict[str, str] = {}
    if like is not None:
        with contextlib.suppress(RuntimeFailure):
            labels = volume_labels(engine, like)
    if not labels:
        labels = engine.labels({LABEL_CLUSTER: cluster_id} if cluster_id else {})
    return with_size(labels, size_gb)


class EngineVolumeIO:
    """Our volumes on ``engine``, as tar streams. ``name``: the runtime's name."""

    def __init__(self, engine: Engine, name: str) -> None:
        self.engine = engine
        self.name = name

    @contextlib.contextmanager
    def read(self, volume: str) -> Iterator[Iterator[Chunk]]:
        with contextlib.ExitStack() as stack:
            chunks: Iterator[Chunk] | None = None
            if is_local_engine(self.engine.base_url):
                with contextlib.suppress(NotHere):  # raised before anything was read
                    chunks = stack.enter_context(volume_tar_fifo(self.engine, volume))
            if chunks is None:
                chunks = stack.enter_context(volume_tar_stream(self.engine, volume))
            yield chunks

    def write(
        self,
        volume: str,
        cluster_id: str | None,
        chunks: Iterable[Chunk],
        *,
        like: str | None = None,
        on_progress: Progress | None = None,
        size_gb: int = 0,
    ) -> int:
        labels = target_labels(self.engine, like, cluster_id, size_gb)
        return fill_volume(self.engine, volume, labels, chunks, on_progress=on_progress)

    def remove_readers(self, volume: str) -> None:
        remove_helpers(self.engine, volume, role=LEGACY_ROLE_RESTIC)
        remove_restic_helpers(self.engine, volume)
        remove_helpers(self.engine, volume)  # a tar stream's reader

    def copy_to(
        self,
        volume: str,
        target: VolumeIO,
        target_volume: str,
        cluster_id: str,
        on_progress: Progress | None = None,
    ) -> int:
        return target.accept_engine_copy(
            self.name, self.engine, volume, target_volume, cluster_id, on_progress
        )

    def accept_engine_copy(
        self,
        source_name: str,
        source: Engine,
        source_volume: str,
        volume: str,
        cluster_id: str,
        on_progress: Progress | None = None,
    ) -> int:
        # The labels are the source volume's (runtimes/volumes/copy.py), which name the cluster.
        result = copy_volume(source, source_volume, self.engine, volume, on_progress=on_progress)
        return int(result.bytes_copied)

    def accept_file_copy(
        self,
        source_name: str,
        files: Mapping[str, str],
        volume: str,
        cluster_id: str,
        on_progress: Progress | None = None,
    ) -> int:
        raise RuntimeFailure(
            f"cannot copy a volume from a {source_name} engine to a {self.name} engine"
        )
