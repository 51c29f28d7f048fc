"""The GPU type catalog in the store."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpuyard.core.catalog import SEED_GPU_TYPES
from gpuyard.core.models import GpuTypeInfo
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


def to_info(row: GpuType) -> GpuTypeInfo:
    return GpuTypeInfo(
        id=row.id,
        display_name=row.display_name,
        manufacturer=row.manufacturer,
        memory_gb=row.memory_gb,
        secure_price=row.secure_price,
        community_price=row.community_price,
        secure_spot_price=row.secure_spot_price,
        community_spot_price=row.community_spot_price,
    )


def list_gpu_types(session: Session) -> list[GpuTypeInfo]:
    return [to_info(r) for r in session.scalars(select(GpuType).order_by(GpuType.id))]


def find_gpu_type(session: Session, name: str) -> GpuTypeInfo | None:
    """By exact id, or case-insensitively by id or display name ("RTX A6000")."""
    row = session.get(GpuType, name)
    if row is None:
        low = name.strip().lower()
        for candidate in session.scalars(select(GpuType)):
            if low in (candidate.id.lower(), candidate.display_name.lower()):
                row = candidate
                break
    return to_info(row) if row else None
