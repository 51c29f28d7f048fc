"""Where a serverless worker's container reaches this server: the base URL its
RunPod worker environment (``RUNPOD_WEBHOOK_*``) points below.

``GPUYARD_SERVERLESS_CALLBACK_URL`` when set (a fleet with remote hosts names an
address they all reach). Otherwise derived from where the server listens:

- on loopback only with ``GPUYARD_SERVERLESS_WORKER_PORT`` set:
  ``host.containers.internal`` (Podman names the host so in every container: its own
  network's gateway) at that port, where ``gpuyard serve`` opens a second listener on
  every address for requests carrying a worker key only (api/http/worker_listener.py);
- on every address (``GPUYARD_HOST=0.0.0.0`` or ``::``): the public address
  (``GPUYARD_PUBLIC_ADDRESS``) when one is set, else ``host.containers.internal``;
- on one address that is not loopback: that address;
- on loopback only without a worker port: ``host.containers.internal`` at the API's
  port, which containers cannot reach (``gpuyard serve`` says so at start:
  :func:`unreachable_warning`).

docs/decisions.md "Where serverless workers reach the server" says why.
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


def worker_port(settings: Settings) -> int | None:
    """The port of the worker listener ``gpuyard serve`` opens on every address, or
    None: it opens none (the server does not listen on loopback only, a callback URL is
    set, or no worker port is)."""
    if settings.serverless_callback_url or not _is_loopback(settings.host.strip()):
        return None
    return settings.serverless_worker_port


def unreachable_warning(settings: Settings) -> str | None:
    """Why workers' containers cannot reach this server as configured, or None."""
    if settings.serverless_callback_url or not _is_loopback(settings.host.strip()):
        return None
    if settings.serverless_worker_port:
        return None
    return (
        "the API listens on loopback only, so serverless workers' containers cannot reach "
        "it: set GPUYARD_SERVERLESS_WORKER_PORT (a listener for workers only), "
        "GPUYARD_HOST=0.0.0.0, or GPUYARD_SERVERLESS_CALLBACK_URL"
    )


def callback_base_url(settings: Settings) -> str:
    """The base URL (no trailing slash) workers' containers call this server at."""
    if settings.serverless_callback_url:
        return settings.serverless_callback_url.rstrip("/")
    host = settings.host.strip()
    if host in _WILDCARDS:
        return _url(settings.public_address or HOST_FROM_CONTAINER, settings.port)
    if _is_loopback(host):
        return _url(HOST_FROM_CONTAINER, settings.serverless_worker_port or settings.port)
    return _url(host, settings.port)
