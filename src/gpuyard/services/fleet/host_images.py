"""The image names present on the healthy hosts' engines (``GET /v1/host-images``).

Names only, with how many hosts hold each: nothing about which tenant's cluster uses an
image or which host it is, so any authenticated caller may read it. A host whose engine
cannot be asked right now is left out (the answer says how many were).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import select

from gpuyard.runtimes.base import ImageListing, Runtime
from gpuyard.services.context import Context
from gpuyard.store.schema import Host


@dataclass(frozen=True)
class HostImages:
    # (name, number of hosts holding it), most widely held first, then by name.
    images: tuple[tuple[str, int], ...]
    # Healthy hosts whose engine did not answer (their images are not counted).
    hosts_unanswered: int


def host_images(ctx: Context, runtime_of: Callable[[int], Runtime]) -> HostImages:
    """Ask each healthy host's engine (``runtime_of``) which images it holds, outside
    any transaction."""
    with ctx.read() as session:
        host_ids = list(session.scalars(select(Host.id).where(Host.healthy.is_(True))))
    counts: Counter[str] = Counter()
    unanswered = 0
    for host_id in host_ids:
        try:
            runtime = runtime_of(host_id)
            if not isinstance(runtime, ImageListing):
                continue
            counts.update(set(runtime.local_images()))
        except Exception:  # one host's engine being away leaves its images out, no more
            unanswered += 1
    ordered = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return HostImages(images=tuple(ordered), hosts_unanswered=unanswered)
