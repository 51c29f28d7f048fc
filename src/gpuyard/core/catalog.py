"""The GPU types a fresh installation offers, with on-demand prices and spot floors
(USD per GPU-hour). Admins edit the catalog afterwards; this only seeds it."""

from __future__ import annotations

from gpuyard.core.models import GpuTypeInfo


def _gpu(
    id: str, name: str, mem: int, secure: float, community: float, s_spot: float, c_spot: float
) -> GpuTypeInfo:
    return GpuTypeInfo(id, name, "Nvidia", mem, secure, community, s_spot, c_spot)


SEED_GPU_TYPES: tuple[GpuTypeInfo, ...] = (
    _gpu("NVIDIA GeForce RTX 3090", "RTX 3090", 24, 0.43, 0.22, 0.21, 0.11),
    _gpu("NVIDIA GeForce RTX 4090", "RTX 4090", 24, 0.69, 0.34, 0.35, 0.20),
    _gpu("NVIDIA RTX A4000", "RTX A4000", 16, 0.32, 0.17, 0.16, 0.09),
    _gpu("NVIDIA RTX A5000", "RTX A5000", 24, 0.36, 0.16, 0.18, 0.10),
    _gpu("NVIDIA RTX A6000", "RTX A6000", 48, 0.76, 0.33, 0.20, 0.16),
    _gpu("NVIDIA RTX 6000 Ada Generation", "RTX 6000 Ada", 48, 0.88, 0.74, 0.44, 0.37),
    _gpu("NVIDIA L4", "L4", 24, 0.43, 0.28, 0.22, 0.14),
    _gpu("NVIDIA L40S", "L40S", 48, 0.86, 0.79, 0.43, 0.40),
    _gpu("NVIDIA A40", "A40", 48, 0.40, 0.35, 0.20, 0.18),
    _gpu("NVIDIA A100 80GB PCIe", "A100 PCIe", 80, 1.64, 1.19, 0.82, 0.60),
    _gpu("NVIDIA A100-SXM4-80GB", "A100 SXM", 80, 1.89, 1.39, 0.95, 0.70),
    _gpu("NVIDIA H100 PCIe", "H100 PCIe", 80, 2.39, 1.99, 1.20, 1.00),
    _gpu("NVIDIA H100 80GB HBM3", "H100 SXM", 80, 2.99, 2.69, 1.50, 1.35),
    _gpu("NVIDIA H200", "H200 SXM", 141, 3.99, 3.59, 2.00, 1.80),
)
