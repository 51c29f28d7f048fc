"""Hourly rates of a cluster, from the GPU catalog and storage/compute prices.

All amounts are USD per hour, rounded to 6 decimals (micro-dollars) so sums stay exact.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuyard.core.models import CloudType, GpuTypeInfo

HOURS_PER_MONTH = 730.0


@dataclass(frozen=True)
class Prices:
    """Prices that are not per GPU type. Storage prices are per GB-month, as users read them."""

    vcpu_hour: float = 0.0
    memory_gb_hour: float = 0.0
    container_disk_gb_month: float = 0.10
    volume_gb_month_running: float = 0.10
    volume_gb_month_stopped: float = 0.20


@dataclass(frozen=True)
class RateParts:
    gpu: float
    compute: float
    container_disk: float
    volume: float

    @property
    def total(self) -> float:
        return round(self.gpu + self.compute + self.container_disk + self.volume, 6)


def gpu_price(gpu: GpuTypeInfo, cloud_type: CloudType) -> float:
    return gpu.community_price if cloud_type == CloudType.COMMUNITY else gpu.secure_price


def hourly_rate(
    *,
    gpu: GpuTypeInfo | None,
    gpu_count: int,
    cpu_cores: int,
    memory_gb: int,
    container_disk_gb: int,
    volume_gb: int,
    cloud_type: CloudType,
    running: bool,
    prices: Prices,
    bid_per_gpu: float | None = None,
) -> RateParts:
    """The rate while running (everything) or while stopped (the volume only).
    An interruptible cluster's GPUs cost its ``bid_per_gpu`` instead of the list price."""
    volume_month = prices.volume_gb_month_running if running else prices.volume_gb_month_stopped
    volume = round(volume_gb * volume_month / HOURS_PER_MONTH, 6)
    if not running:
        return RateParts(gpu=0.0, compute=0.0, container_disk=0.0, volume=volume)
    unit = bid_per_gpu if bid_per_gpu is not None else (gpu_price(gpu, cloud_type) if gpu else 0.0)
    gpu_part = round(unit * gpu_count, 6) if gpu_count else 0.0
    compute = round(cpu_cores * prices.vcpu_hour + memory_gb * prices.memory_gb_hour, 6)
    disk = round(container_disk_gb * prices.container_disk_gb_month / HOURS_PER_MONTH, 6)
    return RateParts(gpu=gpu_part, compute=compute, container_disk=disk, volume=volume)


def spot_floor(gpu: GpuTypeInfo, cloud_type: CloudType) -> float:
    """The lowest bid per GPU-hour the market accepts for ``gpu``."""
    if cloud_type == CloudType.COMMUNITY:
        return gpu.community_spot_price
    if cloud_type == CloudType.SECURE:
        return gpu.secure_spot_price
    return min(gpu.secure_spot_price, gpu.community_spot_price)
