"""Proxy addresses (core/network/proxy.py) and the Caddy configuration made of routes
(edge/caddy_config.py): pure functions, no Caddy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpuyard.core.network.proxy import (
    ProxyBase,
    ProxyRoute,
    ProxyStatus,
    Visibility,
    parse_host,
    presented_key,
    proxy_only_ports,
    session_cookies,
)
from gpuyard.edge.caddy_config import ProxyListen, caddy_config

CID = "k3v9x0a1b2c3d4"
BASE = ProxyBase("http", "proxy.localhost", 8080)
LISTEN = ProxyListen("127.0.0.1", 8080, "127.0.0.1:8000", "unix//run/caddy.sock")


def route(visibility: Visibility, port: int = 8888, cid: str = CID) -> ProxyRoute:
    return ProxyRoute(cid, port, visibility, "127.0.0.1:20001")


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


def _host_routes(config: dict[str, Any], host: str) -> list[dict[str, Any]]:
    for r in config["apps"]["http"]["servers"]["gpuyard"]["routes"]:
        if r.get("match") == [{"host": [host]}]:
            subroutes: list[dict[str, Any]] = r["handle"][0]["routes"]
            return subroutes
    raise AssertionError(f"no route for {host}")


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


def test_public_port_is_forwarded_to_anybody_without_gpuyard_credentials() -> None:
    config = caddy_config([route(Visibility.PUBLIC)], BASE, LISTEN)
    routes = _host_routes(config, f"{CID}-8888.proxy.localhost")
    assert routes[0]["match"] == [{"path": [f"/v1/clusters/{CID}/ports/8888/open"]}]
    assert routes[0]["handle"][0]["upstreams"] == [{"dial": "127.0.0.1:8000"}]
    assert routes[1] == _DROP_GY_AUTHORIZATION
    assert routes[2] == {
        "handle": [
            {
                "handler": "reverse_proxy",
                "upstreams": [{"dial": "127.0.0.1:20001"}],
                "headers": {"request": _NO_CREDENTIALS},
            }
        ]
    }


def test_private_port_is_checked_by_the_api_on_every_request() -> None:
    listen = ProxyListen("127.0.0.1", 8080, "127.0.0.1:8000", "unix//s", api_secret="vouch")
    config = caddy_config([route(Visibility.PRIVATE)], BASE, listen)
    opened, refusal, check, drop_auth, forward = _host_routes(config, f"{CID}-8888.proxy.localhost")
    assert opened["handle"][0]["headers"]["request"]["set"] == {"X-Gpuyard-Proxy": ["vouch"]}
    # No cookie of that name and no key: the proxy's own 401, the API is not asked.
    assert refusal["match"] == [
        {
            "not": [
                {"header": {"Cookie": ["*gy_proxy=*"]}},
                {"header": {"X-Gpuyard-Api-Key": ["*"]}},
                {"header": {"Authorization": ["Bearer gy_*", "bearer gy_*", "gy_*"]}},
            ]
        }
    ]
    assert refusal["handle"][0]["status_code"] == 401 and refusal["terminal"] is True
    # Everything else: the API decides (no secret is in the configuration).
    assert "match" not in check
    asked = check["handle"][0]
    assert asked["rewrite"] == {"method": "GET", "uri": "/v1/proxy/authorize"}
    assert asked["headers"]["request"]["set"]["Expect"] == ["100-continue"]
    assert asked["headers"]["request"]["set"]["X-Gpuyard-Proxy"] == ["vouch"]
    # What reaches the container carries no key and no session cookie.
    assert drop_auth == _DROP_GY_AUTHORIZATION
    assert forward["handle"][0]["headers"] == {"request": _NO_CREDENTIALS}


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
    config = caddy_config([], BASE, LISTEN)
    server = config["apps"]["http"]["servers"]["gpuyard"]
    assert server["listen"] == ["127.0.0.1:8080"]
    assert server["protocols"] == ["h1", "h2", "h2c"]
    assert server["routes"][-1]["handle"][0]["status_code"] == 404
    error = server["errors"]["routes"][0]["handle"][0]
    assert error["rewrite"]["uri"] == "/v1/proxy/unavailable"
    assert config["admin"] == {"listen": "unix//run/caddy.sock", "config": {"persist": False}}


def test_logs_lose_secrets() -> None:
    fields = caddy_config([], BASE, LISTEN)["logging"]["logs"]["default"]["encoder"]["fields"]
    deleted = {a["parameter"] for a in fields["request>uri"]["actions"]}
    assert deleted == {"token", "api_key", "apikey"}
    for header in ("Authorization", "Cookie", "X-Gpuyard-Api-Key"):
        assert fields[f"request>headers>{header}"] == {"filter": "delete"}


def test_tls_when_a_certificate_is_given() -> None:
    listen = ProxyListen(
        "0.0.0.0", 443, "127.0.0.1:8000", "unix//s", Path("/c.pem"), Path("/k.pem")
    )
    config = caddy_config([], ProxyBase("https", "gpu.example.com", 443), listen)
    assert config["apps"]["tls"]["certificates"]["load_files"] == [
        {"certificate": "/c.pem", "key": "/k.pem"}
    ]
    assert config["apps"]["http"]["servers"]["gpuyard"]["tls_connection_policies"] == [{}]


def test_config_is_stable_and_sorted() -> None:
    a = [route(Visibility.PUBLIC, 1, "b" * 14), route(Visibility.PRIVATE, 2, "a" * 14)]
    one = caddy_config(a, BASE, LISTEN)
    two = caddy_config(list(reversed(a)), BASE, LISTEN)
    assert json.dumps(one, sort_keys=True) == json.dumps(two, sort_keys=True)


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
