"""A restart's volume, checked while its container is created (runtimes/engines/runtime.py
``create``): the volume was made or seen by this runtime before, so the container's
create, which mounts it by name, need not wait for the check. Should the volume have
gone behind gpuyard's back, the engine makes a bare one of that name for the mount:
the check tells, and the runtime removes that one and makes the volume again the
first-time way (labelled, sized)."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

import docker.errors

from gpuyard.runtimes.engines.disk import size_label
from gpuyard.runtimes.engines.engine import Engine


def recheck_volume(engine: Engine, name: str, labels: Mapping[str, str] | None = None) -> bool:
    """True when volume ``name`` is there as made (labelled; then grown to the labels'
    size, as Engine.prepare_volume does for a volume it finds); False when it is gone
    or bare (the engine may just have made it, with no labels, for a container's
    mount)."""
    with engine.errors(f"checking volume {name}"):
        try:
            info = engine.api.inspect_volume(name)
        except docker.errors.NotFound:
            return False
    if not info.get("Labels"):
        return False
    size = size_label(labels)
    if size:
        engine.disk.grow(name, info, size)
    return True


def remove_mount_made_volume(engine: Engine, name: str) -> None:
    """Remove volume ``name`` if the engine made it for a container's mount (it has no
    labels at all); a labelled one, anybody's, stays. A missing one is fine."""
    with engine.errors(f"removing volume {name}"):
        try:
            info = engine.api.inspect_volume(name)
        except docker.errors.NotFound:
            return
        if info.get("Labels"):
            return
        with contextlib.suppress(docker.errors.NotFound):
            engine.api.remove_volume(name)
