"""Node plans (``sku_id``): fixed node sizes per GPU type, priced from the catalog.

Plans are seeded at start-up for every GPU type of the catalog: n GPUs (n in 1, 2,
4, 8) with 8 vCPUs and 32 GB of memory per GPU. Rows are only ever added, so a
``sku_id`` keeps naming the same size across restarts and catalog edits. Prices are
not stored: they follow the catalog and the compute prices in effect.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpuyard.core.billing.pricing import Prices, hourly_rate
from gpuyard.core.errors import ValidationFailed
from gpuyard.core.models import CloudType, GpuTypeInfo
from gpuyard.services.access.resource_util import in_id_range, one_id
from gpuyard.services.catalog.gpu_types import list_gpu_types
from gpuyard.services.context import Context
from gpuyard.store.schema import Plan

GPUS_PER_NODE = (1, 2, 4, 8)
CPUS_PER_GPU = 8
MEMORY_GB_PER_GPU = 32


def plan_name(gpu: GpuTypeInfo, gpus: int) -> str:
    """``A6000x2``: the display name without the ``RTX`` brand and spaces."""
    short = gpu.display_name.removeprefix("RTX ").replace(" ", "")
    return f"{short or gpu.id}x{gpus}"


def seed_plans(session: Session) -> None:
    """Add the plans that are missing (per GPU type and GPU count); never renumber,
    rename or delete existing ones. A name taken by another plan (two GPU types
    with the same display name) falls back to the GPU type's id."""
    have = {(p.gpu_type, p.gpus_per_node) for p in session.scalars(select(Plan))}
    names = set(session.scalars(select(Plan.name)))
    for gpu in list_gpu_types(session):
        for n in GPUS_PER_NODE:
            if (gpu.id, n) in have:
                continue
            name = plan_name(gpu, n)
            if name in names:
                name = f"{gpu.id}x{n}"
            names.add(name)
            session.add(
                Plan(
                    name=name,
                    gpu_type=gpu.id,
                    gpus_per_node=n,
                    cpus_per_node=CPUS_PER_GPU * n,
                    memory_gb_per_node=MEMORY_GB_PER_GPU * n,
                )
            )
    session.flush()


def plan_price(plan: Plan, gpu: GpuTypeInfo | None, prices: Prices) -> float:
    """USD per node-hour: the GPUs at the secure on-demand price plus compute. A GPU
    type no longer in the catalog prices the GPUs at 0 (such plans are not listed)."""
    return hourly_rate(
        gpu=gpu,
        gpu_count=plan.gpus_per_node,
        cpu_cores=plan.cpus_per_node,
        memory_gb=plan.memory_gb_per_node,
        container_disk_gb=0,
        volume_gb=0,
        cloud_type=CloudType.SECURE,
        running=True,
        prices=prices,
    ).total


def plan_view(plan: Plan, price: float) -> dict[str, Any]:
    """The API shape of a plan."""
    return {
        "sku_id": plan.id,
        "name": plan.name,
        "gpu_type": plan.gpu_type,
        "gpus_per_node": plan.gpus_per_node,
        "cpus_per_node": plan.cpus_per_node,
        "memory_gb_per_node": plan.memory_gb_per_node,
        "price_per_hour": price,
    }


def list_plans(ctx: Context) -> list[dict[str, Any]]:
    """Every plan whose GPU type is in the catalog, by ``sku_id``, with its price at
    the installation's prices (anybody with a key)."""
    with ctx.read() as session:
        gpus = {g.id: g for g in list_gpu_types(session)}
        return [
            plan_view(p, plan_price(p, gpus[p.gpu_type], ctx.settings.prices))
            for p in session.scalars(select(Plan).order_by(Plan.id))
            if p.gpu_type in gpus
        ]


def get_plan(session: Session, sku_id: int) -> Plan:
    """The plan ``sku_id`` names. Raises ValidationFailed("sku_id", "plan 9 not
    found") for an unknown id (or a non-integer one from a JSON body)."""
    wanted = one_id(sku_id, "sku_id", "plan")
    row = session.get(Plan, wanted) if in_id_range(wanted) else None
    if row is None:
        raise ValidationFailed("sku_id", f"plan {wanted} not found", {"sku_id": wanted})
    return row
