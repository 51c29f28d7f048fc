"""Hosts and GPU types as every cluster read needs them, cached briefly.

They change rarely (host registration at start, catalog edits), while every
``GET /v1/clusters/{id}`` shows them; a few seconds of staleness in a host's name or
a GPU's display name is harmless, and prices are re-read by the paths that bill.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import cast

from sqlalchemy import Connection, select
from sqlalchemy.orm import Session

from gpuyard.core.models import GpuTypeInfo
from gpuyard.services.catalog.gpu_type_rows import to_info
from gpuyard.store.schema import GpuType, Host


@dataclass(frozen=True)
class HostRef:
    """The few fields of a host that cluster reads show beside each cluster (its name,
    where it is, whether it answers); the admin's full view of a host is
    services/fleet/views.py HostView."""

    name: str
    location: str
    address: str
    gpu_source: str
    # What the heartbeats say (False: unreachable) and the operator's status.
    reachable: bool = True
    status: str = "active"
    is_local: bool = True
    # Where clients reach its published ports when not at ``address`` (operator's
    # setting); None: at ``address``.
    client_address: str | None = None


class ReferenceCache:
    def __init__(self, ttl_s: float = 5.0) -> None:
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._expires = 0.0
        self._hosts: dict[int, HostRef] = {}
        self._gpus: dict[str, GpuTypeInfo] = {}

    def stale(self) -> bool:
        with self._lock:
            return time.monotonic() >= self._expires

    def get(
        self, db: Session | Connection | None
    ) -> tuple[dict[int, HostRef], dict[str, GpuTypeInfo]]:
        """Host views by id and GPU types by id, re-read through ``db`` when older than
        ``ttl_s``; without ``db`` the cached values are returned as they are."""
        with self._lock:
            if time.monotonic() < self._expires or db is None:
                return self._hosts, self._gpus
        hosts = {
            r.id: HostRef(
                r.name,
                r.location,
                r.address,
                r.gpu_source,
                r.unreachable_since is None,
                r.status,
                r.is_local,
                r.client_address,
            )
            for r in db.execute(
                select(
                    Host.id,
                    Host.name,
                    Host.location,
                    Host.address,
                    Host.gpu_source,
                    Host.unreachable_since,
                    Host.status,
                    Host.is_local,
                    Host.client_address,
                )
            )
        }
        gpus = {
            r.id: to_info(cast(GpuType, r)) for r in db.execute(select(*GpuType.__table__.columns))
        }
        with self._lock:
            self._hosts, self._gpus = hosts, gpus
            self._expires = time.monotonic() + self.ttl_s
        return hosts, gpus

    def invalidate(self) -> None:
        with self._lock:
            self._expires = 0.0
