"""Copying a volume from one host's engine to another's.

Real engines copy through their archive API (runtimes/volume_copy.py: a tar stream
between helper containers, never through the user's container); the in-memory runtime
copies its files, so the move logic is tested without engines.
"""

from __future__ import annotations

from collections.abc import Callable

from gpuyard.core.errors import RuntimeFailure
from gpuyard.runtimes.base import Runtime
from gpuyard.runtimes.engine import Engine
from gpuyard.runtimes.fake import FakeRuntime

Progress = Callable[[int], None]


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
    copy converges). Returns the bytes copied. Raises RuntimeFailure.

    Two hosts served by one engine (one engine for every host row, as in tests) share
    their volumes: the volume is already there, nothing is copied (0)."""
    if source is target and source_volume == target_volume:
        return 0
    if isinstance(source, FakeRuntime) and isinstance(target, FakeRuntime):
        return _copy_fake(source, source_volume, target, target_volume, cluster_id, on_progress)
    src_engine = getattr(source, "engine", None)
    dst_engine = getattr(target, "engine", None)
    if isinstance(src_engine, Engine) and isinstance(dst_engine, Engine):
        from gpuyard.runtimes.volume_copy import copy_volume

        result = copy_volume(
            src_engine, source_volume, dst_engine, target_volume, on_progress=on_progress
        )
        return int(result.bytes_copied)
    raise RuntimeFailure(
        f"cannot copy a volume from a {source.name} engine to a {target.name} engine"
    )


def _copy_fake(
    source: FakeRuntime,
    source_volume: str,
    target: FakeRuntime,
    target_volume: str,
    cluster_id: str,
    on_progress: Progress | None,
) -> int:
    if source.unavailable:
        raise RuntimeFailure(f"source engine unreachable: {source.unavailable}")
    if target.unavailable:
        raise RuntimeFailure(f"target engine unreachable: {target.unavailable}")
    try:
        files = source.volume_files(source_volume)
    except KeyError as exc:
        raise RuntimeFailure(f"volume {source_volume} not found on the source host") from exc
    target.ensure_volume(target_volume, cluster_id)
    target.replace_volume_files(target_volume, files)
    copied = sum(len(v.encode()) for v in files.values())
    if on_progress is not None:
        on_progress(copied)
    return copied
