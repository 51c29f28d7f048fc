"""Locations: where hosts are (``Host.location``), with their GPU capacity."""

from __future__ import annotations

from typing import Any

from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

from gpuyard.core.errors import ValidationFailed
from gpuyard.core.placement import AllocationRatios, free_resources
from gpuyard.services.context import Context
from gpuyard.services.fleet.hosts import capacities
from gpuyard.store.schema import Host


def list_locations(ctx: Context) -> list[dict[str, Any]]:
    """Every location that has a host, by name: how many hosts (and healthy ones) and,
    per GPU type, the GPUs of its hosts that take placements (active and healthy: a
    cordoned, draining or unreachable host offers nothing) and how many are free
    under the installation's allocation ratios (anybody with a key)."""
    with ctx.read() as session:
        return _locations(session, ctx.settings.allocation_ratios)


def _locations(session: Session, ratios: AllocationRatios) -> list[dict[str, Any]]:
    counts = session.execute(
        select(
            Host.location,
            func.count(),
            func.sum(case((Host.healthy.is_(True), 1), else_=0)),
        )
        .group_by(Host.location)
        .order_by(Host.location)
    )
    out: dict[str, dict[str, Any]] = {}
    totals: dict[str, dict[str, list[int]]] = {}
    for name, hosts, healthy in counts:
        out[name] = {"location": name, "hosts": int(hosts), "healthy_hosts": int(healthy or 0)}
        totals[name] = {}
    for cap in capacities(session):
        where = totals.setdefault(cap.location, {})
        free = free_resources(cap, ratios)["gpus"]
        for g in cap.gpus:
            where.setdefault(g.gpu_type, [0, 0])[0] += 1
        for gpu_type, n in free.items():
            where.setdefault(gpu_type, [0, 0])[1] += n
    return [
        {
            **out[name],
            "gpu_types": [
                {"gpu_type": t, "total_gpus": total, "free_gpus": free}
                for t, (total, free) in sorted(totals[name].items())
            ],
        }
        for name in sorted(out)
    ]


def location_exists(session: Session, location: str) -> bool:
    """Whether any host (healthy or not) is at ``location``."""
    return session.scalar(select(Host.id).where(Host.location == location).limit(1)) is not None


def check_location(session: Session, location: str, field: str = "location") -> None:
    """Raise ValidationFailed on ``field`` (listing the known locations) when no host,
    whatever its state, is at ``location``: a typo is an input error, while a known
    location without free capacity is INSUFFICIENT_CAPACITY at placement."""
    if not location_exists(session, location):
        known = sorted(set(session.scalars(select(Host.location))))
        raise ValidationFailed(field, f"unknown location {location!r}", {"locations": known})
