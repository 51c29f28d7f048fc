"""Where a serverless worker's container reaches this server: the base URL its
RunPod worker environment (``RUNPOD_WEBHOOK_*``) points below.

``GPUYARD_SERVERLESS_CALLBACK_URL`` when set (a fleet with remote hosts names an
address they all reach). Otherwise derived from where the server listens:

- on every address (``GPUYARD_HOST=0.0.0.0`` or ``::``): the public address
  (``GPUYARD_PUBLIC_ADDRESS``) when one is set, else ``host.containers.internal``,
  which Podman resolves in every container to its own network's gateway: the host;
- on one address that is not loopback: that address;
- on loopback only: ``host.containers.internal`` at the worker listener's port
  (``GPUYARD_SERVERLESS_WORKER_PORT``, default the server's port + 1), which ``gpuyard
  serve`` opens on every address for requests carrying a worker key only
  (api/http/worker_listener.py; docs/decisions.md "Where serverless workers reach the
  server").
"""

from __future__ import annotations

import ipaddress

from gpuyard.settings import Settings

# What Podman names the host in every container's /etc/hosts (its network's gateway).
HOST_FROM_CONTAINER = "host.containers.internal"
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


def worker_port(settings: Settings) -> int:
    """The worker listener's port (used when the server listens on loopback only)."""
    return settings.serverless_worker_port or settings.port + 1


def needs_worker_listener(settings: Settings) -> bool:
    """Whether workers are told the worker listener's port: the server listens on
    loopback only and no callback URL is set."""
    return not settings.serverless_callback_url and _is_loopback(settings.host.strip())


def callback_base_url(settings: Settings) -> str:
    """The base URL (no trailing slash) workers' containers call this server at."""
    if settings.serverless_callback_url:
        return settings.serverless_callback_url.rstrip("/")
    host = settings.host.strip()
    if host in _WILDCARDS:
        return _url(settings.public_address or HOST_FROM_CONTAINER, settings.port)
    if _is_loopback(host):
        return _url(HOST_FROM_CONTAINER, worker_port(settings))
    return _url(host, settings.port)
