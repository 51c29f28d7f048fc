"""Which host ports a user may ask for.

An ``external_port`` a user names must lie in ``GPUYARD_PORT_RANGE_START..END`` (the
range the operator opened for clusters) and must not be one of the server's own ports;
0 asks gpuyard to assign one from the range. Every surface (REST v1 and v2, GraphQL)
reaches the same use cases, which check here, so each answers the same
VALIDATION_ERROR in its own envelope.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpuyard.core.errors import ValidationFailed
from gpuyard.core.models import PortSpec
from gpuyard.settings import Settings


def server_ports(settings: Settings) -> frozenset[int]:
    """The ports the gpuyard server itself listens on: never handed to a cluster."""
    return frozenset({settings.port})


def check_external_ports(ports: Iterable[PortSpec], settings: Settings, field: str) -> None:
    """Refuse a requested host port outside the configured range or taken by the
    server. ``field`` names the list (``ports``, ``port_mapping_updates``); the error
    names the item: ``ports[1].external_port``. Raises ValidationFailed."""
    low, high = settings.port_range_start, settings.port_range_end
    own = server_ports(settings)
    for i, spec in enumerate(ports):
        port = spec.external_port
        if not port:
            continue
        where = f"{field}[{i}].external_port"
        if port in own:
            raise ValidationFailed(
                where,
                f"port {port} is the gpuyard server's own port",
                {"external_port": port},
            )
        if not low <= port <= high:
            raise ValidationFailed(
                where,
                f"must be 0 (assign one) or lie in the host port range {low}-{high}",
                {"external_port": port, "range_start": low, "range_end": high},
            )
