"""A stored GPU type as the rest of the code knows it (core/models.py GpuTypeInfo).
Below both the catalog's reads (gpu_types.py) and the reference cache that every
Context holds (references.py)."""

from __future__ import annotations

from gpuyard.core.models import GpuTypeInfo
from gpuyard.store.schema import GpuType


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
