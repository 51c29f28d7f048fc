"""A host's own refusals of a cluster placed on it, checked by every create and start
after placement: CPU/memory limits or disk sizes it cannot enforce, private ports it
cannot keep private, unless the operator allows each. Each reads the host from the
session (an identity-map hit where the caller holds the row)."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from gpuyard.core.errors import (
    DiskNotEnforced,
    InsufficientCapacity,
    LimitsNotEnforced,
    PrivatePortsExposed,
)
from gpuyard.core.network.proxy import private_on_loopback, proxy_only_ports
from gpuyard.services.capacity.batch_claims import HostFacts
from gpuyard.services.context import Context
from gpuyard.store.schema import Host


def refuse_unenforced_limits(session: Session, ctx: Context, host_id: int) -> None:
    """Raise LimitsNotEnforced when ``host_id``'s engine cannot apply CPU/memory limits
    and the operator has not allowed that (GPUYARD_ALLOW_UNENFORCED_LIMITS)."""
    _limits(session.get(Host, host_id), host_id, ctx)


def _limits(host: HostFacts | None, host_id: int, ctx: Context) -> None:
    if host is None or host.enforces_limits or ctx.settings.allow_unenforced_limits:
        return
    raise LimitsNotEnforced(
        f"host {host.name}'s container engine cannot enforce CPU/memory limits "
        f"({host.limits_note or 'refused by the engine'}); the operator can fix its cgroup "
        "setup or allow running without limits (GPUYARD_ALLOW_UNENFORCED_LIMITS=true)",
        {"host_id": host_id, "enforces_limits": False},
    )


def refuse_unenforced_disk(session: Session, ctx: Context, host_id: int) -> None:
    """Raise DiskNotEnforced when ``host_id`` cannot enforce volume or container disk
    sizes and the operator has not allowed that (GPUYARD_ALLOW_UNENFORCED_DISK)."""
    _disk(session.get(Host, host_id), host_id, ctx)


def _disk(host: HostFacts | None, host_id: int, ctx: Context) -> None:
    if host is None or host.enforces_disk or ctx.settings.allow_unenforced_disk:
        return
    raise DiskNotEnforced(
        f"host {host.name} cannot enforce disk sizes ({host.disk_note or 'not known'}); "
        'the operator can give it what docs/decisions.md "Disk sizes" lists, or allow '
        "unenforced sizes (GPUYARD_ALLOW_UNENFORCED_DISK=true)",
        {"host_id": host_id, "enforces_disk": False},
    )


def refuse_exposed_private_ports(
    session: Session, ctx: Context, host_id: int, ports: list[dict[str, Any]]
) -> None:
    """Raise PrivatePortsExposed when ``ports`` hold a private http port and
    ``host_id``'s engine cannot keep it private (a ``tcp://`` engine: the proxy has no
    way to a port on that host's loopback, so it would be published on the host's
    addresses, core/network/proxy.py ``private_on_loopback``), unless the operator has allowed
    that (GPUYARD_ALLOW_EXPOSED_PRIVATE_PORTS)."""
    _private_ports(session.get(Host, host_id), host_id, ctx, ports)


def _private_ports(
    host: HostFacts | None, host_id: int, ctx: Context, ports: list[dict[str, Any]]
) -> None:
    if host is None or ctx.settings.allow_exposed_private_ports:
        return
    private = proxy_only_ports(ports)
    if not private or private_on_loopback(host.is_local, host.engine_url):
        return
    raise PrivatePortsExposed(
        f"host {host.name} is reached over tcp://, so its private http ports "
        f"({', '.join(str(p) for p in sorted(private))}) would answer on its addresses "
        "without the proxy's checks; declare them public, or the operator can add the "
        "host over ssh:// or allow it (GPUYARD_ALLOW_EXPOSED_PRIVATE_PORTS=true)",
        {"host_id": host_id, "ports": sorted(private)},
    )


def refuse_host_of_new(
    host: HostFacts | None, host_id: int, ctx: Context, ports: list[dict[str, Any]]
) -> None:
    """All three checks of a new cluster on ``host`` (the row, as the caller holds it),
    in the order a create makes them. No row (a host the caller did not read, or one
    gone) refuses: nothing is known that could let the cluster on."""
    if host is None:
        raise InsufficientCapacity("the cluster's host is gone", {"host_id": host_id})
    _limits(host, host_id, ctx)
    _disk(host, host_id, ctx)
    _private_ports(host, host_id, ctx, ports)
