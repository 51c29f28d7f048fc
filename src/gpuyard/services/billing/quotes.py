"""What a cluster would cost before it is made: the create form's estimate.

The same arithmetic the ledger bills by (core/billing/pricing.py ``hourly_rate``), on the
sizing fields of a create request, so an estimate never disagrees with the bill.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from gpuyard.core.billing.pricing import RateParts, hourly_rate, spot_floor
from gpuyard.core.models import CloudType
from gpuyard.services.clusters.use_cases import resolve_gpu_type, spot_bid
from gpuyard.services.context import Context
from gpuyard.services.tenancy.auth import Principal
from gpuyard.services.volumes.network_volumes import load_network_volume


class QuoteRequest(BaseModel):
    """The sizing fields of ``POST /v1/clusters`` (same names, limits and defaults)."""

    model_config = ConfigDict(extra="ignore")

    gpu_type: str | None = Field(default=None, max_length=100)
    gpu_count: int | None = Field(default=None, ge=0, le=64, strict=True)
    cpu_cores: int = Field(default=2, ge=1, le=1024, strict=True)
    memory_gb: int = Field(default=4, ge=1, le=16384, strict=True)
    container_disk_gb: int = Field(default=10, ge=1, le=65536, strict=True)
    volume_gb: int = Field(default=0, ge=0, le=1048576, strict=True)
    cloud_type: CloudType = CloudType.SECURE
    interruptible: bool = Field(default=False, strict=True)
    bid_per_gpu: float | None = Field(default=None, gt=0, le=1000, strict=True)
    # A network volume is billed on its own meter, not as the cluster's volume.
    network_volume_id: str | None = Field(default=None, min_length=1, max_length=100)


@dataclass(frozen=True)
class Quote:
    running: RateParts
    stopped: RateParts


def quote(ctx: Context, principal: Principal, body: QuoteRequest) -> Quote:
    """The hourly rate while running and while stopped, for ``principal``'s account.
    Raises ValidationFailed naming the field (an unknown GPU type, a bid under the spot
    floor), NetworkVolumeNotFound for a network volume the caller does not have."""
    gpu_count = body.gpu_count if body.gpu_count is not None else (1 if body.gpu_type else 0)
    with ctx.read() as session:
        gpu = resolve_gpu_type(session, body.gpu_type) if gpu_count or body.gpu_type else None
        if body.network_volume_id:
            # Billed on its own: the cluster then has no volume of its own to price.
            load_network_volume(session, principal, body.network_volume_id)
    bid = None
    if gpu is not None and (body.interruptible or body.bid_per_gpu is not None):
        # Spot pays its bid; without one yet, the floor (the least it can pay).
        bid = (
            spot_bid(gpu, gpu_count, body.cloud_type, body.bid_per_gpu)
            if body.bid_per_gpu is not None
            else spot_floor(gpu, body.cloud_type)
        )
    volume_gb = 0 if body.network_volume_id else body.volume_gb

    def rate(running: bool) -> RateParts:
        return hourly_rate(
            gpu=gpu,
            gpu_count=gpu_count,
            cpu_cores=body.cpu_cores,
            memory_gb=body.memory_gb,
            container_disk_gb=body.container_disk_gb,
            volume_gb=volume_gb,
            cloud_type=body.cloud_type,
            running=running,
            prices=ctx.settings.prices,
            bid_per_gpu=bid,
        )

    return Quote(running=rate(True), stopped=rate(False))
