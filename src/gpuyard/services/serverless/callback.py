"""Where a serverless worker's container reaches this server: the base URL its
RunPod worker environment (``RUNPOD_WEBHOOK_*``) points below.

``GPUYARD_SERVERLESS_CALLBACK_URL`` when set (a fleet with remote hosts names an
address they all reach). Otherwise derived from where the server listens:

- on every address (``GPUYARD_HOST=0.0.0.0`` or ``::``): the public address
  (``GPUYARD_PUBLIC_ADDRESS``) when one is set, else the local Podman bridge's gateway
  (``GPUYARD_SERVERLESS_BRIDGE_GATEWAY``, 10.88.0.1), which a container on the local
  engine reaches the host at;
- on one address that is not loopback: that address;
- on loopback only: the bridge's gateway, where ``gpuyard serve`` opens a second
  listener for the serverless worker routes only (docs/decisions.md "Where serverless
  workers reach the server").
"""

from __future__ import annotations

import ipaddress

from gpuyard.settings import Settings

_WILDCARDS = ("", "0.0.0.0", "::")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _url(host: str, port: int) -> str:
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}"


def callback_base_url(settings: Settings) -> str:
    """The base URL (no trailing slash) workers' containers call this server at."""
    if settings.serverless_callback_url:
        return settings.serverless_callback_url.rstrip("/")
    host = settings.host.strip()
    if host in _WILDCARDS:
        return _url(settings.public_address or settings.serverless_bridge_gateway, settings.port)
    if _is_loopback(host):
        return _url(settings.serverless_bridge_gateway, settings.port)
    return _url(host, settings.port)


def needs_bridge_listener(settings: Settings) -> bool:
    """Whether the server listens on loopback only and workers are told the bridge's
    gateway: then it must also listen there (for the worker routes)."""
    return not settings.serverless_callback_url and _is_loopback(settings.host.strip())
