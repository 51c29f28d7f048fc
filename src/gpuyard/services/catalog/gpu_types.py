"""The GPU type catalog in the store."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpuyard.core.catalog import SEED_GPU_TYPES
from gpuyard.core.models import GpuTypeInfo
from gpuyard.core.placement import free_resources
from gpuyard.services.catalog.gpu_type_rows import to_info
from gpuyard.services.context import Context
from gpuyard.services.fleet.hosts import capacities
from gpuyard.store.schema import GpuType


def seed_catalog(session: Session) -> None:
    """Insert the seed GPU types that are missing; never overwrite an admin's edits."""
    have = set(session.scalars(select(GpuType.id)))
    for g in SEED_GPU_TYPES:
        if g.id not in have:
            session.add(
                GpuType(
                    id=g.id,
                    display_name=g.display_name,
                    manufacturer=g.manufacturer,
                    memory_gb=g.memory_gb,
                    secure_price=g.secure_price,
                    community_price=g.community_price,
                    secure_spot_price=g.secure_spot_price,
                    community_spot_price=g.community_spot_price,
                )
            )


def list_gpu_types(session: Session) -> list[GpuTypeInfo]:
    return [to_info(r) for r in session.scalars(select(GpuType).order_by(GpuType.id))]


# session.info key: the types found in this session's transaction, by the name asked.
_FOUND = "gpuyard.gpu_types_found"


def find_gpu_type(session: Session, name: str) -> GpuTypeInfo | None:
    """By exact id, or case-insensitively by id or display name ("RTX A6000").

    Asked again in the same session (a start prices the cluster before and after its
    changes, and places it), the answer is the one found first: the catalog is
    written only when the store is seeded, never by a use case."""
    found: dict[str, GpuTypeInfo | None] = session.info.setdefault(_FOUND, {})
    if name in found:
        return found[name]
    row = session.get(GpuType, name)
    if row is None:
        low = name.strip().lower()
        for candidate in session.scalars(select(GpuType)):
            if low in (candidate.id.lower(), candidate.display_name.lower()):
                row = candidate
                break
    info = found[name] = to_info(row) if row else None
    return info


def catalog_types(ctx: Context, names: list[str] | None = None) -> list[GpuTypeInfo]:
    """The whole catalog by id (``names`` None), or the types ``names`` name (as
    ``find_gpu_type`` finds them, each once, in the order first named; unknown names
    give nothing). Anybody with a key."""
    with ctx.read() as session:
        if names is None:
            return list_gpu_types(session)
        found = [find_gpu_type(session, n) for n in names]
        return list({g.id: g for g in found if g is not None}.values())


@dataclass(frozen=True)
class GpuTypeOffer:
    """A catalog entry with how many GPUs of the type the hosts have in all, and how
    many are free right now (under the allocation ratios)."""

    info: GpuTypeInfo
    total_gpus: int
    available_gpus: int


def gpu_type_offers(ctx: Context) -> list[GpuTypeOffer]:
    """Every GPU type of the catalog, by id, with its GPUs in all and free now."""
    with ctx.read() as session:
        types = list_gpu_types(session)
        caps = capacities(session)
    ratios = ctx.settings.allocation_ratios
    free: dict[str, int] = {}
    total: dict[str, int] = {}
    for cap in caps:
        for name, n in free_resources(cap, ratios)["gpus"].items():
            free[name] = free.get(name, 0) + n
        for g in cap.gpus:
            total[g.gpu_type] = total.get(g.gpu_type, 0) + 1
    return [GpuTypeOffer(g, total.get(g.id, 0), free.get(g.id, 0)) for g in types]
