"""Copying a volume from one host's engine to another's, through each runtime's
:class:`~gpuyard.runtimes.capabilities.VolumeIO`: real engines copy through their
archive API (runtimes/volumes/copy.py: a tar stream between helper containers, never
through the user's container); the in-memory runtime copies its files, so the move
logic is tested without engines.
"""

from __future__ import annotations

from gpuyard.runtimes.base import Runtime
from gpuyard.runtimes.capabilities import Progress


def copy_volume_between(
    source: Runtime,
    source_volume: str,
    target: Runtime,
    target_volume: str,
    cluster_id: str,
    on_progress: Progress | None = None,
) -> int:
    """Copy ``source_volume`` on ``source``'s engine to ``target_volume`` on
    ``target``'s (made there, labelled for ``cluster_id``; emptied first, so a retried
    copy converges). Returns the bytes copied. Raises RuntimeFailure, also when the two
    engines are of kinds that cannot copy to each other.

    Two hosts served by one engine (one engine for every host row, as in tests) share
    their volumes: the volume is already there, nothing is copied (0)."""
    if source is target and source_volume == target_volume:
        return 0
    return source.volume_io().copy_to(
        source_volume, target.volume_io(), target_volume, cluster_id, on_progress
    )
