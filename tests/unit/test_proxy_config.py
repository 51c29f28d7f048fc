"""Proxy addresses (core/network/proxy.py) and the Caddy configuration
(edge/caddy_config.py), which names no cluster: pure functions, no Caddy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpuyard.core.network.proxy import (
    ProxyBase,
    ProxyStatus,
    parse_host,
    presented_key,
    proxy_only_ports,
    session_cookies,
)
from gpuyard.edge.caddy_config import ProxyListen, caddy_config

CID = "k3v9x0a1b2c3d4"
BASE = ProxyBase("http", "proxy.localhost", 8080)
LISTEN = ProxyListen(
    "127.0.0.1", 8080, "127.0.0.1:8000", "unix//run/caddy.sock", resolver="127.0.0.1:5300"
)


@pytest.mark.parametrize(
    ("host", "want"),
    [
        (f"{CID}-8888.proxy.localhost", (CID, 8888)),
        (f"{CID}-8888.proxy.localhost:8080", (CID, 8888)),
        (f"{CID.upper()}-8888.PROXY.LOCALHOST.", (CID, 8888)),
        (f"{CID}-65535.proxy.localhost", (CID, 65535)),
        (f"{CID}-65536.proxy.localhost", None),
        (f"{CID}-0.proxy.localhost", None),
        (f"{CID}-8888.proxy.localhost.evil.com", None),
        (f"x.{CID}-8888.proxy.localhost", None),
        ("short-8888.proxy.localhost", None),
        ("proxy.localhost", None),
        ("", None),
    ],
)
def test_parse_host(host: str, want: tuple[str, int] | None) -> None:
    assert parse_host(host, "proxy.localhost") == want


def test_urls_name_the_port_only_when_needed() -> None:
    assert BASE.url(CID, 8888) == f"http://{CID}-8888.proxy.localhost:8080"
    assert ProxyBase("https", "gpu.example.com", 443).url(CID, 80) == (
        f"https://{CID}-80.gpu.example.com"
    )
    assert ProxyBase("http", "p.test", 80).open_link(CID, 1, "tok") == (
        f"http://{CID}-1.p.test/v1/clusters/{CID}/ports/1/open?token=tok"
    )


def test_status_says_why_until_ready() -> None:
    status = ProxyStatus(enabled=True)
    assert status.problem() == "the proxy has not been configured yet"
    status.set(False, "Caddy is not installed")
    assert status.problem() == "Caddy is not installed"
    status.set(True, None)
    assert status.problem() is None
    assert "disabled" in (ProxyStatus(enabled=False).problem() or "")


def _cluster_routes(config: dict[str, Any]) -> list[dict[str, Any]]:
    first = config["apps"]["http"]["servers"]["gpuyard"]["routes"][0]
    assert first["match"] == [{"host": ["*.proxy.localhost"]}]
    subroutes: list[dict[str, Any]] = first["handle"][0]["routes"]
    return subroutes


_NO_CREDENTIALS = {
    "delete": ["X-Gpuyard-Proxy", "X-Gpuyard-Api-Key"],
    "replace": {
        "Cookie": [
            {"search_regexp": "(^|;)\\s*gy_proxy=[^;]*", "replace": "$1"},
            {"search_regexp": "^[;\\s]+|[;\\s]+$", "replace": ""},
            {"search_regexp": ";[;\\s]*;", "replace": ";"},
        ]
    },
}
_DROP_GY_AUTHORIZATION = {
    "match": [{"header": {"Authorization": ["Bearer gy_*", "bearer gy_*", "gy_*"]}}],
    "handle": [{"handler": "headers", "request": {"delete": ["Authorization"]}}],
}
_MAY_PASS = [
    {"header": {"Cookie": ["*gy_proxy=*"]}},
    {"header": {"X-Gpuyard-Api-Key": ["*"]}},
    {"header": {"Authorization": ["Bearer gy_*", "bearer gy_*", "gy_*"]}},
]


def _forward(label: int = 2) -> dict[str, Any]:
    resolver = {"addresses": ["udp/127.0.0.1:5300"]}
    return {
        "handler": "reverse_proxy",
        "dynamic_upstreams": {
            "source": "srv",
            "name": f"{{http.request.host.labels.{label}}}.port.gpuyard-routes.internal.",
            "refresh": "1s",
            "resolver": resolver,
            "dial_timeout": "1s",
        },
        "transport": {"protocol": "http", "resolver": resolver},
        "headers": {"request": _NO_CREDENTIALS},
    }


def _marker(kind: str) -> list[dict[str, Any]]:
    return [
        {
            "file": {
                "root": "/home/caddy/routes",
                "try_files": [f"/{kind}/{{http.request.host.labels.2}}"],
            }
        }
    ]


def test_each_request_finds_its_port_in_the_route_table() -> None:
    listen = ProxyListen(
        "127.0.0.1", 8080, "127.0.0.1:8000", "unix//s", api_secret="vouch",
        resolver="127.0.0.1:5300", markers="/home/caddy/routes",
    )  # fmt: skip
    opened, public, private, forwarded, nothing = _cluster_routes(caddy_config(BASE, listen))
    # Any proxy host's open link goes to the API (which takes it only on its own host).
    assert opened["match"] == [{"path": ["/v1/clusters/*/ports/*/open"]}]
    assert opened["handle"][0]["upstreams"] == [{"dial": "127.0.0.1:8000"}]
    assert opened["handle"][0]["headers"]["request"]["set"] == {"X-Gpuyard-Proxy": ["vouch"]}
    # A public port (its marker file): forwarded to anybody, without gpuyard credentials,
    # to the upstream the resolver names.
    assert public["match"] == _marker("public") and public["terminal"] is True
    assert public["handle"][0]["routes"] == [_DROP_GY_AUTHORIZATION, {"handle": [_forward()]}]
    # A private port: no cookie of that name and no key is the proxy's own 401 ...
    assert private["match"] == _marker("private") and private["terminal"] is True
    refusal, check, drop_auth, forward = private["handle"][0]["routes"]
    assert refusal["match"] == [{"not": _MAY_PASS}]
    assert refusal["handle"][0]["status_code"] == 401 and refusal["terminal"] is True
    assert "{http.request.host.labels.2} is private" in refusal["handle"][0]["body"]
    # ... everything else: the API decides (no secret is in the configuration) ...
    assert "match" not in check
    asked = check["handle"][0]
    assert asked["rewrite"] == {"method": "GET", "uri": "/v1/proxy/authorize"}
    assert asked["headers"]["request"]["set"]["Expect"] == ["100-continue"]
    assert asked["headers"]["request"]["set"]["X-Gpuyard-Proxy"] == ["vouch"]
    assert "Upgrade" in asked["headers"]["request"]["delete"]
    # ... and what reaches the container carries no key and no session cookie.
    assert drop_auth == _DROP_GY_AUTHORIZATION
    assert forward == {"handle": [_forward()]}
    # A private port of an ssh:// host: the same checks, then its forward's socket
    # (the marker links to it), as Caddy dials it.
    assert forwarded["match"] == _marker("forward")
    checks = forwarded["handle"][0]["routes"]
    assert checks[:3] == [refusal, check, drop_auth]
    assert checks[3]["handle"] == [
        {
            "handler": "reverse_proxy",
            "upstreams": [{"dial": "unix//home/caddy/routes/forward/{http.request.host.labels.2}"}],
            "headers": {"request": _NO_CREDENTIALS},
        }
    ]
    # No marker: no such port.
    assert nothing["handle"][0]["status_code"] == 404


def test_the_host_label_is_counted_from_the_domain() -> None:
    config = caddy_config(ProxyBase("https", "gpu.example.com", 443), LISTEN)
    first = config["apps"]["http"]["servers"]["gpuyard"]["routes"][0]
    assert first["match"] == [{"host": ["*.gpu.example.com"]}]
    public = first["handle"][0]["routes"][1]
    assert public["match"][0]["file"]["try_files"] == ["/public/{http.request.host.labels.3}"]
    name = public["handle"][0]["routes"][1]["handle"][0]["dynamic_upstreams"]["name"]
    assert name == "{http.request.host.labels.3}.port.gpuyard-routes.internal."


def test_the_configuration_depends_only_on_the_proxy_settings() -> None:
    one = json.dumps(caddy_config(BASE, LISTEN), sort_keys=True)
    assert one == json.dumps(caddy_config(BASE, LISTEN), sort_keys=True)
    assert CID not in one
    other = ProxyListen(
        "127.0.0.1", 8080, "127.0.0.1:8000", "unix//run/caddy.sock", resolver="127.0.0.1:5301"
    )
    assert json.dumps(caddy_config(BASE, other), sort_keys=True) != one


def test_the_session_cookie_is_matched_by_its_exact_name() -> None:
    assert session_cookies(["gy_proxy=abc"]) == ["abc"]
    assert session_cookies(["a=1; gy_proxy=abc; b=2", "gy_proxy=def"]) == ["abc", "def"]
    assert session_cookies([' gy_proxy="abc" ']) == ["abc"]
    assert session_cookies(["x=agy_proxy=abc"]) == []
    assert session_cookies(["x=gy_proxy=abc"]) == []
    assert session_cookies(["gy_proxyx=abc; xgy_proxy=abc; gy_proxy="]) == []


def test_the_key_the_proxy_is_shown() -> None:
    assert presented_key("gy_k", "Basic YTpi") == "gy_k"
    assert presented_key(None, "Bearer gy_k") == "gy_k"
    assert presented_key(None, "gy_k") == "gy_k"
    assert presented_key(None, "Basic YTpi") is None  # the application's own
    assert presented_key(None, "Bearer someone-elses-token") is None
    assert presented_key("", None) is None


def test_only_private_http_ports_are_kept_off_the_hosts_addresses() -> None:
    ports = [
        {"internal_port": 8888, "protocol": "http"},
        {"internal_port": 8889, "protocol": "http", "visibility": "private"},
        {"internal_port": 7860, "protocol": "http", "visibility": "public"},
        {"internal_port": 22, "protocol": "tcp"},
    ]
    assert proxy_only_ports(ports) == {8888, 8889}


def test_everything_else_is_404_and_errors_go_to_the_status_page() -> None:
    config = caddy_config(BASE, LISTEN)
    server = config["apps"]["http"]["servers"]["gpuyard"]
    assert server["listen"] == ["127.0.0.1:8080"]
    assert server["protocols"] == ["h1", "h2", "h2c"]
    assert server["routes"][-1]["handle"][0]["status_code"] == 404
    error = server["errors"]["routes"][0]["handle"][0]
    assert error["rewrite"]["uri"] == "/v1/proxy/unavailable"
    # Credentials never go along.
    assert set(error["headers"]["request"]["delete"]) >= {
        "Authorization",
        "X-Gpuyard-Api-Key",
        "Cookie",
        # A WebSocket's page is a plain GET (as an upgrade, the API would answer 403).
        "Connection",
        "Upgrade",
    }
    assert config["admin"] == {"listen": "unix//run/caddy.sock", "config": {"persist": False}}


def test_logs_lose_secrets() -> None:
    fields = caddy_config(BASE, LISTEN)["logging"]["logs"]["default"]["encoder"]["fields"]
    deleted = {a["parameter"] for a in fields["request>uri"]["actions"]}
    assert deleted == {"token", "api_key", "apikey"}
    for header in ("Authorization", "Cookie", "X-Gpuyard-Api-Key"):
        assert fields[f"request>headers>{header}"] == {"filter": "delete"}


def test_tls_when_a_certificate_is_given() -> None:
    listen = ProxyListen(
        "0.0.0.0", 443, "127.0.0.1:8000", "unix//s", Path("/c.pem"), Path("/k.pem")
    )
    config = caddy_config(ProxyBase("https", "gpu.example.com", 443), listen)
    assert config["apps"]["tls"]["certificates"]["load_files"] == [
        {"certificate": "/c.pem", "key": "/k.pem"}
    ]
    assert config["apps"]["http"]["servers"]["gpuyard"]["tls_connection_policies"] == [{}]


def test_open_link_tokens_never_reach_the_log() -> None:
    from gpuyard.cli.serve import redact

    line = 'GET /v1/clusters/x/ports/8888/open?token=AbC-123_x HTTP/1.1" 302'
    assert redact(line) == 'GET /v1/clusters/x/ports/8888/open?token=*** HTTP/1.1" 302'


def test_the_proxy_vouches_for_its_clients_address() -> None:
    from gpuyard.api.http.rate_limit import _source

    def scope(*headers: tuple[bytes, bytes]) -> dict[str, Any]:
        return {"client": ("127.0.0.1", 5000), "headers": list(headers)}

    forwarded = (b"x-forwarded-for", b"198.51.100.7, 203.0.113.9")
    assert _source(scope(forwarded, (b"x-gpuyard-proxy", b"vouch")), b"vouch") == "203.0.113.9"
    # Without the proxy's secret, or with another one, the peer is the source.
    assert _source(scope(forwarded), b"vouch") == "127.0.0.1"
    assert _source(scope(forwarded, (b"x-gpuyard-proxy", b"guess")), b"vouch") == "127.0.0.1"
    assert _source(scope(forwarded, (b"x-gpuyard-proxy", b"vouch")), None) == "127.0.0.1"


def test_session_answers_are_kept_for_their_ttl_and_bounded() -> None:
    from gpuyard.services.access.proxy_access import SessionChecks

    now = [100.0]
    checks = SessionChecks(ttl_s=2.0, max_entries=2, clock=lambda: now[0])
    host = f"{CID}-8888.proxy.localhost"
    assert checks.cached(host, ["a"]) is None
    checks.store(host, ["a"], True)
    checks.store(host.upper(), ["b"], False)
    assert checks.cached(host, ["a"]) is True and checks.cached(host, ["b"]) is False
    assert checks.cached(host, ["a", "b"]) is None  # another set of cookies
    now[0] += 2.0  # a revoked session is refused once its answer is this old
    assert checks.cached(host, ["a"]) is None
    for value in ("c", "d", "e"):
        checks.store(host, [value], True)
    assert checks.cached(host, ["c"]) is None and checks.cached(host, ["e"]) is True
