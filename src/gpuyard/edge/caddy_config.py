"""The whole Caddy configuration (JSON) of the HTTP proxy.

gpuyard owns the Caddy instance it configures: a sync loads this document with
``POST /load`` when Caddy serves another one, so a Caddy that restarted empty, or was
changed by hand, converges to it. Pure: no I/O.

The document names no cluster: it depends only on where the proxy listens, its domain,
its certificate, the API's address, the resolver's and the route table's folder. Caddy
2.6 ends every upgraded connection (WebSockets) and in-flight response of the old
configuration when it loads one, so creating, terminating or moving a cluster, or
changing its ports, must not load anything. Each request finds its cluster port at
request time instead, by the host's first label ``{cluster_id}-{port}``: its
visibility from the route table's marker files (Caddy's ``file`` matcher, a ``stat``
per request), its upstream from Caddy's dynamic upstreams, an SRV lookup of
``{label}.port.Z`` in the zone of gpuyard's resolver (``edge/proxy_resolver.py``, a
process of its own reading the route table the proxy-sync duty writes; answers kept
:data:`REFRESH`). See ``edge/route_table.py``.

For a host ``{label}.{domain}``, in order (first match wins):

1. the ``open`` link path goes to the API, which swaps its one-time token for a
   session cookie on this host (the cookie is then host-only: it opens this port only;
   the API takes a token only on its own port's host);
2. a public port is forwarded;
3. a private port: a request with no session cookie and no gpuyard API key
   (``Authorization: Bearer gy_…``, ``Authorization: gy_…`` or ``X-Gpuyard-Api-Key``)
   answers 401 with a page saying how to get in; any other is checked by the API
   (Caddy's forward_auth, on every request: the API matches the cookie by its exact
   name, and keeps answers for a few seconds), and forwarded when the API lets it
   through;
4. anything else (no such port) answers 404.

Whatever the visibility, what reaches a container carries no gpuyard credential:
``X-Gpuyard-Api-Key``, an ``Authorization`` holding a gpuyard key and the session
cookie are removed (the application's own Authorization and cookies pass).

A container that does not answer (stopped, starting) gets the API's page naming the
cluster's status (502). A host outside the proxy domain answers 404.

Responses stream both ways (Caddy passes a response of unknown length, chunked or
server-sent events, on as it comes; one of known length in large writes), WebSockets
pass through, and no timeout cuts a long response. No access log is configured, and
the error log has tokens, keys and cookies taken out, so Caddy writes none of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuyard.core.network.proxy import (
    KEY_PREFIXES,
    OPEN_PATH,
    SESSION_COOKIE,
    ProxyBase,
    page_html,
)
from gpuyard.edge.proxy_resolver import ZONE

SERVER_NAME = "gpuyard"
KEY_HEADER = "X-Gpuyard-Api-Key"
PROXY_HEADER = "X-Gpuyard-Proxy"
AUTHORIZE_PATH = "/v1/proxy/authorize"
UNAVAILABLE_PATH = "/v1/proxy/unavailable"
# How long Caddy keeps a lookup: a terminated cluster's port, or one made private,
# stops answering this long after the route table lost it (at most).
REFRESH = "1s"


@dataclass(frozen=True)
class ProxyListen:
    """Where the proxy listens, where it reaches the API, and its certificate."""

    bind: str
    port: int
    api_upstream: str
    admin: str
    tls_cert: Path | None = None
    tls_key: Path | None = None
    # Sent to the API with every request Caddy makes to it (PROXY_HEADER), so the API
    # may take the client's address from X-Forwarded-For for those requests alone.
    api_secret: str = ""
    # The proxy resolver's UDP address (edge/proxy_resolver.py).
    resolver: str = "127.0.0.1:53"
    # Where the route table's marker files are (edge/route_table.py publish).
    markers: str = "/nonexistent"


def page(status: int, title: str, text: str) -> dict[str, Any]:
    """A static HTML answer saying why a request went no further."""
    return {
        "handler": "static_response",
        "status_code": status,
        "headers": {
            "Content-Type": ["text/html; charset=utf-8"],
            "Cache-Control": ["no-store"],
        },
        "body": page_html(title, text),
    }


# The session cookie taken out of a Cookie header, the others kept: a pair named
# exactly gy_proxy at the start or after a ";" (never "x=agy_proxy=…", a cookie "x"),
# then the separator it leaves behind.
_COOKIE_STRIP: list[dict[str, str]] = [
    {"search_regexp": f"(^|;)\\s*{SESSION_COOKIE}=[^;]*", "replace": "$1"},
    {"search_regexp": "^[;\\s]+|[;\\s]+$", "replace": ""},
    {"search_regexp": ";[;\\s]*;", "replace": ";"},
]


_NO_GPUYARD_CREDENTIALS: dict[str, Any] = {
    "request": {
        "delete": [PROXY_HEADER, KEY_HEADER],
        "replace": {"Cookie": _COOKIE_STRIP},
    }
}


def _forward(listen: ProxyListen, base: ProxyBase) -> dict[str, Any]:
    """To the container the resolver names for this host's label, with no gpuyard
    credential: never the proxy's header (only the API may see it), the key header or
    the session cookie. A gpuyard key in Authorization was taken out before
    (:data:`_DROP_KEY_AUTHORIZATION`)."""
    # Caddy 2.6 dials a resolver over TCP unless the address names udp.
    resolver = {"addresses": [f"udp/{listen.resolver}"]}
    return {
        "handler": "reverse_proxy",
        "dynamic_upstreams": {
            "source": "srv",
            "name": f"{_label(base)}.port.{ZONE}.",
            "refresh": REFRESH,
            "resolver": resolver,
            "dial_timeout": "1s",
        },
        # The SRV target is a name of the resolver's zone too (never an address).
        "transport": {"protocol": "http", "resolver": resolver},
        "headers": _NO_GPUYARD_CREDENTIALS,
    }


def _forward_socket(listen: ProxyListen, base: ProxyBase) -> dict[str, Any]:
    """As :func:`_forward`, to the SSH forward's unix socket the host's marker links
    to (Caddy expands the placeholder per request)."""
    return {
        "handler": "reverse_proxy",
        "upstreams": [{"dial": f"unix/{listen.markers}/forward/{_label(base)}"}],
        "headers": _NO_GPUYARD_CREDENTIALS,
    }


def _label(base: ProxyBase) -> str:
    """The placeholder of the host's cluster port label (``{cluster_id}-{port}``):
    Caddy counts a host's labels from the right, from 0, and it comes right after the
    domain's."""
    return f"{{http.request.host.labels.{len(base.domain.strip('.').split('.'))}}}"


def _marked(listen: ProxyListen, base: ProxyBase, kind: str) -> dict[str, Any]:
    """Matches a host whose port has a marker file of ``kind`` (``public``, ``private``)."""
    return {"file": {"root": listen.markers, "try_files": [f"/{kind}/{_label(base)}"]}}


def _to_api(listen: ProxyListen) -> dict[str, Any]:
    """A request on its way to the API (an open link), vouched for by the proxy."""
    return {
        "handler": "reverse_proxy",
        "upstreams": [{"dial": listen.api_upstream}],
        "headers": {"request": {"set": {PROXY_HEADER: [listen.api_secret]}}},
    }


_DROP_KEY_HEADER = {"handler": "headers", "request": {"delete": [KEY_HEADER]}}


_UPGRADE_HEADERS = (
    "Connection",
    "Upgrade",
    "Sec-WebSocket-Key",
    "Sec-WebSocket-Version",
    "Sec-WebSocket-Extensions",
    "Sec-WebSocket-Protocol",
)


def _authorize(listen: ProxyListen) -> dict[str, Any]:
    """Caddy's forward_auth: ask the API; a 2xx answer lets the request go on, any
    other answer (401, 404 pages) is what the client gets."""
    return {
        "handler": "reverse_proxy",
        "upstreams": [{"dial": listen.api_upstream}],
        "rewrite": {"method": "GET", "uri": AUTHORIZE_PATH},
        # Caddy 2.6 would send the request's body along to the check, and the container
        # would then get what is left of it. With "Expect: 100-continue" the body is
        # sent only after a 100 Continue, which the API never answers (it reads no
        # body): its final answer comes first and the body stays for the container.
        "transport": {"protocol": "http", "expect_continue_timeout": "60s"},
        "headers": {
            "request": {
                # A WebSocket handshake's check is a plain GET: the API would otherwise
                # take it for a WebSocket of its own (and refuse it, 403).
                "delete": list(_UPGRADE_HEADERS),
                "set": {
                    "Expect": ["100-continue"],
                    PROXY_HEADER: [listen.api_secret],
                    "X-Forwarded-Method": ["{http.request.method}"],
                    "X-Forwarded-Uri": ["{http.request.uri}"],
                },
            }
        },
        "handle_response": [
            {
                "match": {"status_code": [2]},
                # Nothing to copy from the answer: the request goes on to the next
                # handler. (A handler with no routes would not: Caddy would answer the
                # client with the API's empty 200 instead.)
                "routes": [{"handle": [_DROP_KEY_HEADER]}],
            }
        ],
    }


_KEY_IN_AUTHORIZATION: dict[str, Any] = {
    "header": {"Authorization": [f"{prefix}*" for prefix in KEY_PREFIXES]}
}
# Any request that could get through a private port: a session cookie (the API checks
# the exact name) or a gpuyard key. The rest gets the proxy's own 401 page.
_MAY_PASS: list[dict[str, Any]] = [
    {"header": {"Cookie": [f"*{SESSION_COOKIE}=*"]}},
    {"header": {KEY_HEADER: ["*"]}},
    _KEY_IN_AUTHORIZATION,
]
# A gpuyard key in Authorization never reaches a container; the application's own
# Authorization (Basic, its tokens) does.
_DROP_KEY_AUTHORIZATION: dict[str, Any] = {
    "match": [_KEY_IN_AUTHORIZATION],
    "handle": [{"handler": "headers", "request": {"delete": ["Authorization"]}}],
}


_NO_PORT = page(
    404,
    "No such cluster port",
    "This address names no cluster port: the cluster was terminated, never existed, "
    "or does not declare this port as http.",
)


def _private(listen: ProxyListen, base: ProxyBase, forward: dict[str, Any]) -> list[dict[str, Any]]:
    """A private port's routes: the proxy's 401 without a credential, else the API's
    check, then ``forward``."""
    return [
        {
            "match": [{"not": _MAY_PASS}],
            "handle": [
                page(
                    401,
                    "Sign-in required",
                    f"Port {_label(base)} is private. Open it with a link from "
                    "`gpuyard clusters open` (or the API's /ports/{port}/open), or send "
                    "your API key in the Authorization header.",
                )
            ],
            "terminal": True,
        },
        # The API decides (a session cookie, or the owner's key); a refusal is its page.
        {"handle": [_authorize(listen)]},
        _DROP_KEY_AUTHORIZATION,
        forward,
    ]


def _cluster_routes(base: ProxyBase, listen: ProxyListen) -> list[dict[str, Any]]:
    open_path = OPEN_PATH.format(cluster_id="*", port="*")
    forward = {"handle": [_forward(listen, base)]}
    public = [_DROP_KEY_AUTHORIZATION, forward]

    socket = {"handle": [_forward_socket(listen, base)]}
    return [
        {"match": [{"path": [open_path]}], "handle": [_to_api(listen)], "terminal": True},
        {
            "match": [_marked(listen, base, "public")],
            "handle": [{"handler": "subroute", "routes": public}],
            "terminal": True,
        },
        {
            "match": [_marked(listen, base, "private")],
            "handle": [{"handler": "subroute", "routes": _private(listen, base, forward)}],
            "terminal": True,
        },
        {
            "match": [_marked(listen, base, "forward")],
            "handle": [{"handler": "subroute", "routes": _private(listen, base, socket)}],
            "terminal": True,
        },
        {"handle": [_NO_PORT], "terminal": True},
    ]


def _error_page(listen: ProxyListen) -> dict[str, Any]:
    """When a container does not answer (stopped, starting, crashed), the API says
    why, with the cluster's status, on a page of its own (502)."""
    return {
        "handler": "reverse_proxy",
        "upstreams": [{"dial": listen.api_upstream}],
        "rewrite": {"method": "GET", "uri": UNAVAILABLE_PATH},
        "headers": {
            "request": {
                # A WebSocket handshake's page is a plain GET too: passed on as an
                # upgrade, the API would refuse it as a WebSocket of its own (403).
                "delete": ["Authorization", KEY_HEADER, "Cookie", *_UPGRADE_HEADERS],
                "set": {PROXY_HEADER: [listen.api_secret]},
            }
        },
    }


# Caddy logs failed requests (logger http.log.error) with their URI and headers: the
# secrets they may carry are taken out before a line is written.
_SECRET_QUERY = ("token", "api_key", "apikey")
_LOGGING: dict[str, Any] = {
    "logs": {
        "default": {
            "encoder": {
                "format": "filter",
                "wrap": {"format": "json"},
                "fields": {
                    "request>uri": {
                        "filter": "query",
                        "actions": [{"type": "delete", "parameter": p} for p in _SECRET_QUERY],
                    },
                    **{
                        f"request>headers>{h}": {"filter": "delete"}
                        for h in ("Authorization", "Cookie", KEY_HEADER)
                    },
                },
            }
        }
    }
}


def caddy_config(base: ProxyBase, listen: ProxyListen) -> dict[str, Any]:
    """The full configuration: admin on ``listen.admin`` (never persisted to disk), one
    HTTP server routing every host of ``base.domain`` per request, 404 for the rest."""
    server_routes: list[dict[str, Any]] = [
        {
            "match": [{"host": [f"*.{base.domain}"]}],
            "handle": [{"handler": "subroute", "routes": _cluster_routes(base, listen)}],
            "terminal": True,
        },
        {"handle": [_NO_PORT], "terminal": True},
    ]
    server: dict[str, Any] = {
        "listen": [f"{listen.bind}:{listen.port}"],
        "routes": server_routes,
        "errors": {"routes": [{"handle": [_error_page(listen)]}]},
        "protocols": ["h1", "h2", "h2c"],
        "automatic_https": {"disable": True},
    }
    config: dict[str, Any] = {
        "admin": {"listen": listen.admin, "config": {"persist": False}},
        "logging": _LOGGING,
        "apps": {"http": {"servers": {SERVER_NAME: server}}},
    }
    if listen.tls_cert is not None and listen.tls_key is not None:
        server["tls_connection_policies"] = [{}]
        config["apps"]["tls"] = {
            "certificates": {
                "load_files": [{"certificate": str(listen.tls_cert), "key": str(listen.tls_key)}]
            }
        }
    return config
