"""Proxy addresses of clusters' http ports, and what the proxy should do for each.

A cluster's http port ``P`` is reachable at ``{scheme}://{cluster_id}-{P}.{domain}``
(seed 000's ``network.proxy_url``). This module only names things: the routes are
turned into a proxy's configuration by ``edge/caddy_config.py``.
"""

from __future__ import annotations

import html
import re
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from gpuyard.core.errors import ValidationFailed
from gpuyard.core.network.engine_address import parse_engine_url

# A cluster id is 14 lowercase letters and digits (core/ids.py); the port 1-65535.
_HOST_LABEL = re.compile(r"^(?P<cluster>[a-z0-9]{14})-(?P<port>[1-9][0-9]{0,4})$")

SESSION_COOKIE = "gy_proxy"
# Where a private http port is published on its host: loopback, so only the proxy
# reaches it (never another host, nor any container, through the host's addresses).
LOOPBACK = "127.0.0.1"
# Where an ``open`` link lands on a proxy host (the API answers it through the proxy).
OPEN_PATH = "/v1/clusters/{cluster_id}/ports/{port}/open"


class Visibility(StrEnum):
    """``private``: only the owner (API key or an ``open`` link's cookie) gets through;
    ``public``: anybody with the URL."""

    PRIVATE = "private"
    PUBLIC = "public"


@dataclass(frozen=True)
class ProxyBase:
    """How proxy URLs are spelled: ``port`` is shown unless it is the scheme's own."""

    scheme: str
    domain: str
    port: int

    def host(self, cluster_id: str, internal_port: int) -> str:
        return f"{cluster_id}-{internal_port}.{self.domain}"

    def url(self, cluster_id: str, internal_port: int) -> str:
        default = 443 if self.scheme == "https" else 80
        suffix = "" if self.port == default else f":{self.port}"
        return f"{self.scheme}://{self.host(cluster_id, internal_port)}{suffix}"

    def open_link(self, cluster_id: str, internal_port: int, token: str) -> str:
        path = OPEN_PATH.format(cluster_id=cluster_id, port=internal_port)
        return f"{self.url(cluster_id, internal_port)}{path}?token={token}"


def page_html(title: str, text: str) -> str:
    """The page the proxy shows when a request goes no further (the proxy's own pages
    and the API's answers to it look the same)."""
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>"
        f"{html.escape(title)}</title></head><body><h1>{html.escape(title)}</h1>"
        f"<p>{html.escape(text)}</p><p><small>gpuyard proxy</small></p></body></html>\n"
    )


def proxy_only_ports(ports: Iterable[Mapping[str, Any]]) -> frozenset[int]:
    """The internal ports of a cluster's declared ``ports`` that only the proxy may
    reach: its http ports not declared public."""
    return frozenset(
        int(p["internal_port"])
        for p in ports
        if p.get("protocol") == "http" and p.get("visibility", Visibility.PRIVATE) != "public"
    )


def engine_scheme(engine_url: str | None) -> str | None:
    """The scheme of a host's engine URL (``ssh``, ``tcp``, ``unix``); None when there
    is none or it does not parse."""
    if not engine_url:
        return None
    try:
        return parse_engine_url(engine_url).scheme
    except ValidationFailed:
        return None


def private_on_loopback(is_local: bool, engine_url: str | None) -> bool:
    """Whether a host's private http ports are published on its loopback alone: the
    proxy reaches this machine's loopback (its own host, an engine on a local socket)
    and an ssh:// host's through a forward over SSH (runtimes/hosts/ssh_forwards.py). A
    ``tcp://`` engine's host offers no such way: its private ports stay on its
    addresses (docs/decisions.md "Private ports")."""
    return is_local or engine_scheme(engine_url) in ("ssh", "unix")


def parse_host(host: str, domain: str) -> tuple[str, int] | None:
    """``(cluster_id, port)`` of a proxy host name (a ``:port`` suffix is ignored);
    None when ``host`` is not one of ``domain``'s cluster hosts."""
    name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    name = name.lower().rstrip(".")
    suffix = "." + domain.lower().rstrip(".")
    if not name.endswith(suffix):
        return None
    m = _HOST_LABEL.match(name[: -len(suffix)])
    if m is None:
        return None
    port = int(m["port"])
    return (m["cluster"], port) if port <= 65535 else None


# What the proxy takes for a gpuyard API key in ``Authorization`` (the patterns of
# edge/caddy_config.py): anything else there is the application's own, passed on.
KEY_PREFIXES = ("Bearer gy_", "bearer gy_", "gy_")


def presented_key(key_header: str | None, authorization: str | None) -> str | None:
    """The API key a request to the proxy presents: ``X-Gpuyard-Api-Key`` first (beside
    it, Authorization may be the application's own), else an ``Authorization`` that
    holds a gpuyard key (``Bearer gy_…``, ``gy_…``); None when there is none."""
    if key_header and key_header.strip():
        return key_header.strip()
    if authorization and authorization.startswith(KEY_PREFIXES):
        scheme, _, rest = authorization.strip().partition(" ")
        return rest.strip() if scheme.lower() == "bearer" and rest else authorization.strip()
    return None


def session_cookies(cookie_headers: Iterable[str]) -> list[str]:
    """The values of every cookie named exactly :data:`SESSION_COOKIE` in ``Cookie``
    headers (``a=1; gy_proxy=V``): a name is what precedes the first ``=`` of a
    ``;``-separated pair, so ``x=agy_proxy=V`` is a cookie ``x``, never a session."""
    values: list[str] = []
    for header in cookie_headers:
        for pair in header.split(";"):
            name, eq, value = pair.partition("=")
            if eq and name.strip() == SESSION_COOKIE:
                value = value.strip()
                if len(value) >= 2 and value[0] == value[-1] == '"':
                    value = value[1:-1]
                if value:
                    values.append(value)
    return values


@dataclass(frozen=True)
class ProxyRoute:
    """One http port of one cluster as the proxy should serve it: forwarded to
    ``upstream`` (``host:port`` of the published port), for anybody when public, else
    for a request the API lets through (a live session's cookie, or an API key of the
    owner). Nothing here changes when the cluster stops or starts, or when sessions
    come and go, so the proxy's configuration does not either (a stopped cluster's
    port refuses the connection, and the proxy answers a page naming its status)."""

    cluster_id: str
    internal_port: int
    visibility: Visibility
    upstream: str


@dataclass
class ProxyStatus:
    """Whether this process's proxy is serving (its last sync worked), and if not why.
    Views show proxy URLs only while it is; hosts show the reason."""

    enabled: bool
    ready: bool = False
    reason: str | None = "the proxy has not been configured yet"

    def __post_init__(self) -> None:
        self._lock = threading.Lock()

    def set(self, ready: bool, reason: str | None) -> None:
        with self._lock:
            self.ready, self.reason = ready, reason

    def enable(self) -> None:
        """This process runs a proxy: its state is now the proxy's last sync."""
        with self._lock:
            self.enabled = True

    def problem(self) -> str | None:
        """None while serving, else why proxy URLs are null."""
        with self._lock:
            if not self.enabled:
                return "the HTTP proxy is disabled (GPUYARD_PROXY_ENABLED=false)"
            return None if self.ready else self.reason
