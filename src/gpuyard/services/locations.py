"""Locations: where hosts are (``Host.location``), with their GPU capacity."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpuyard.core.placement import AllocationRatios, free_resources
from gpuyard.services.hosts import capacities
from gpuyard.store.schema import Host


def list_locations(session: Session, ratios: AllocationRatios) -> list[dict[str, Any]]:
    """Every location that has a host, by name: how many hosts (and healthy ones) and,
    per GPU type, the GPUs of its healthy hosts and how many of them are free."""
    hosts = list(session.scalars(select(Host).order_by(Host.location, Host.id)))
    location_of = {h.id: h.location for h in hosts}
    out: dict[str, dict[str, Any]] = {}
    totals: dict[str, dict[str, list[int]]] = {}
    for h in hosts:
        out.setdefault(h.location, {"location": h.location, "hosts": 0, "healthy_hosts": 0})
        out[h.location]["hosts"] += 1
        totals.setdefault(h.location, {})
    for cap in capacities(session):
        where = location_of[cap.host_id]
        out[where]["healthy_hosts"] += 1
        free = free_resources(cap, ratios)["gpus"]
        for g in cap.gpus:
            totals[where].setdefault(g.gpu_type, [0, 0])[0] += 1
        for gpu_type, n in free.items():
            totals[where].setdefault(gpu_type, [0, 0])[1] += n
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
