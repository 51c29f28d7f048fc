"""The API's side of the HTTP proxy over real HTTP (fake runtime, no Caddy): proxy URLs
in cluster objects, hosts and GraphQL; open links (issue, redeem once, expiry, who may);
the sessions they become (a cookie per redemption, checked on every request: expiry,
revocation, a revoked key, a removed member); the proxy's key check and status page;
the routes the proxy is given."""

from __future__ import annotations

import json
import time
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from gpuyard.core.network.proxy import ProxyBase, ProxyStatus, Visibility
from gpuyard.core.tls_trust import trusted_tls
from gpuyard.edge.caddy import CaddyError
from gpuyard.edge.caddy_config import ProxyListen
from gpuyard.edge.route_table import parse_table
from gpuyard.reconciler.duties.proxy_sync import ProxySync
from gpuyard.services.access.proxy_routes import load_routes
from gpuyard.services.tenancy.auth import Scope, create_account, issue_key, resolve_key
from gpuyard.testing.fake_runtime import FakeRuntime
from tests.api.test_resources import add_member
from tests.helpers import LiveServer, created, live_server, make_settings

BODY: dict[str, Any] = {
    "gpu_type": "NVIDIA RTX A6000",
    "docker_image": "img",
    "volume_gb": 1,
    "ports": [
        {"internal_port": 8888, "protocol": "http"},
        {"internal_port": 7860, "protocol": "http", "visibility": "public"},
        {"internal_port": 22, "protocol": "tcp"},
    ],
}


@pytest.fixture
def proxied(srv: LiveServer) -> LiveServer:
    """The server with its proxy serving (as after a successful sync)."""
    srv.server.ctx.proxy = ProxyStatus(enabled=True)
    srv.server.ctx.proxy.set(True, None)
    return srv


def other_key(srv: LiveServer, email: str = "other@example.com") -> str:
    with srv.server.ctx.transaction() as session:
        user, account, _ = create_account(session, email=email, name="o")
        return issue_key(
            session, user_id=user.id, account_id=account.id, name="o", scope=Scope.WRITE
        ).key


def own_key(srv: LiveServer, scope: Scope, name: str) -> str:
    with srv.server.ctx.read() as session:
        admin = resolve_key(session, srv.key)
    with srv.server.ctx.transaction() as session:
        return issue_key(
            session, user_id=admin.user_id, account_id=admin.account_id, name=name, scope=scope
        ).key


def expected(srv: LiveServer, status: int) -> None:
    """A 5xx the test asked for (the proxy's status page, PROXY_UNAVAILABLE): not the
    kind of 5xx the server must never answer."""
    srv.recorder.statuses.remove(status)


def proxy_get(srv: LiveServer, url: str) -> httpx.Response:
    """``url`` (on the proxy domain) as the proxy forwards it to the API."""
    parts = urlsplit(url)
    return httpx.get(
        f"{srv.url}{parts.path}?{parts.query}",
        headers={"Host": parts.netloc},
        timeout=10,
        verify=trusted_tls(),
    )


def test_proxy_urls_follow_the_proxy(srv: LiveServer) -> None:
    with srv.client() as c:
        cid = created(srv, c, BODY)
        net = c.get(f"/v1/clusters/{cid}").json()["data"]["network"]
        assert net["proxy_url"] is None  # no proxy in this process
        assert all(p["proxy_url"] is None for p in net["ports"])
        host = c.get("/v1/hosts").json()["data"]["hosts"][0]
        assert host["proxy"] == {
            "available": False,
            "reason": "the HTTP proxy is disabled (GPUYARD_PROXY_ENABLED=false)",
        }
        srv.server.ctx.proxy = ProxyStatus(enabled=True)
        srv.server.ctx.proxy.set(False, "Caddy is not installed")
        assert c.get("/v1/hosts").json()["data"]["hosts"][0]["proxy"]["reason"] == (
            "Caddy is not installed"
        )
        srv.server.ctx.proxy.set(True, None)
        data = c.get(f"/v1/clusters/{cid}").json()["data"]
        base = f"http://{cid}-8888.proxy.localhost:8080"
        assert data["network"]["proxy_url"] == base
        by_port = {p["internal_port"]: p for p in data["network"]["ports"]}
        assert by_port[8888]["proxy_url"] == base and by_port[8888]["visibility"] == "private"
        assert by_port[7860]["proxy_url"] == f"http://{cid}-7860.proxy.localhost:8080"
        assert by_port[7860]["visibility"] == "public"
        assert by_port[22]["proxy_url"] is None
        # A private http port has no address but the proxy's; the others keep theirs.
        assert by_port[8888]["address"] is None
        assert by_port[7860]["address"] and by_port[22]["address"]
        assert c.get("/v1/hosts").json()["data"]["hosts"][0]["proxy"]["available"] is True
        gql = srv.graphql(
            "query($id: String!) { cluster(input: {clusterId: $id}) "
            "{ runtime { ports { privatePort proxyUrl } } } }",
            {"id": cid},
        )
        ports = {
            p["privatePort"]: p["proxyUrl"] for p in gql["data"]["cluster"]["runtime"]["ports"]
        }
        assert ports == {8888: base, 7860: f"http://{cid}-7860.proxy.localhost:8080", 22: None}
        # Stopped: the address stays (the proxy answers a page saying so).
        assert c.post(f"/v1/clusters/{cid}/stop").status_code == 200
        assert srv.server.reconciler.wait_idle(10)
        assert c.get(f"/v1/clusters/{cid}").json()["data"]["network"]["proxy_url"] == base
        assert c.delete(f"/v1/clusters/{cid}").status_code == 200
        assert srv.server.reconciler.wait_idle(10)
        assert c.get(f"/v1/clusters/{cid}").json()["data"]["network"]["proxy_url"] is None


def test_routes_given_to_the_proxy(proxied: LiveServer) -> None:
    with proxied.client() as c:
        cid = created(proxied, c, BODY)
        routes = {r.internal_port: r for r in load_routes(proxied.server.ctx)}
        assert set(routes) == {8888, 7860}
        assert routes[8888].visibility is Visibility.PRIVATE
        assert routes[7860].visibility is Visibility.PUBLIC
        assert routes[8888].upstream.startswith("127.0.0.1:")
        # A stop changes nothing the proxy is told; a terminate removes the routes.
        before = load_routes(proxied.server.ctx)
        assert c.post(f"/v1/clusters/{cid}/stop").status_code == 200
        assert proxied.server.reconciler.wait_idle(10)
        assert load_routes(proxied.server.ctx) == before
        assert c.delete(f"/v1/clusters/{cid}").status_code == 200
        assert proxied.server.reconciler.wait_idle(10)
        assert load_routes(proxied.server.ctx) == []


def test_open_link_works_once(proxied: LiveServer) -> None:
    with proxied.client() as c:
        cid = created(proxied, c, BODY)
        r = c.get(f"/v1/clusters/{cid}/ports/8888/open")
        assert r.status_code == 200, r.text
        data = r.json()["data"]
        link = data["url"]
        assert link.startswith(f"http://{cid}-8888.proxy.localhost:8080/v1/clusters/{cid}/")
        assert data["expires_at"] < data["session_expires_at"]
        landed = proxy_get(proxied, link)
        assert landed.status_code == 302 and landed.headers["location"] == "/"
        cookie = landed.headers["set-cookie"]
        assert cookie.startswith("gy_proxy=")
        assert "httponly" in cookie.lower() and "samesite=lax" in cookie.lower()
        again = proxy_get(proxied, link)
        assert again.status_code == 403 and "does not open" in again.text
        assert "set-cookie" not in again.headers
        # A link of one port opens no other.
        other = c.get(f"/v1/clusters/{cid}/ports/8888/open").json()["data"]["url"]
        assert proxy_get(proxied, other.replace("/ports/8888/", "/ports/7860/")).status_code == 403
        # Every proxy host routes the open path to the API: a link followed on another
        # port's host sets no cookie there, and stays unused.
        elsewhere = other.replace(f"{cid}-8888.", f"{cid}-7860.")
        refused = proxy_get(proxied, elsewhere)
        assert refused.status_code == 403 and "set-cookie" not in refused.headers
        assert proxy_get(proxied, other).status_code == 302
        events = c.get(f"/v1/clusters/{cid}/events").json()["data"]["events"]
        access = [e["message"] for e in events if e["type"] == "access"]
        assert any("issued to API key" in m for m in access)
        assert any("used" in m for m in access)
        assert all(link.split("token=")[1] not in m for m in access)


def redeem(srv: LiveServer, cid: str, port: int = 8888, key: str | None = None, **hdr: str) -> str:
    """The session cookie (``gy_proxy=…``) an open link of ``port`` grants ``key``."""
    with srv.client(key) as c:
        r = c.get(f"/v1/clusters/{cid}/ports/{port}/open", headers=hdr)
        assert r.status_code == 200, r.text
    landed = proxy_get(srv, r.json()["data"]["url"])
    assert landed.status_code == 302, landed.text
    return landed.headers["set-cookie"].split(";")[0]


def proxy_check(srv: LiveServer, host: str, headers: dict[str, str]) -> int:
    """What the API answers the proxy's check of a request to ``host``."""
    r = httpx.get(
        f"{srv.url}/v1/proxy/authorize",
        headers={"X-Forwarded-Host": host, **headers},
        verify=trusted_tls(),
    )
    return r.status_code


def eventually(check: Any, timeout: float = 15.0) -> None:
    """``check()`` holds within ``timeout`` (session answers are kept a few seconds)."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not met"
        time.sleep(0.1)


def test_each_open_link_is_a_session_of_its_own(proxied: LiveServer) -> None:
    with proxied.client() as c:
        cid = created(proxied, c, BODY)
    host = f"{cid}-8888.proxy.localhost:8080"
    first, second = redeem(proxied, cid), redeem(proxied, cid)
    assert first != second  # per session, not one value per port
    value = first.split("=", 1)[1]
    assert proxy_check(proxied, host, {"Cookie": first}) == 200
    assert proxy_check(proxied, host, {"Cookie": f"a=1; {first}; b=2"}) == 200
    # Matched by its exact name: the value inside another cookie opens nothing.
    assert proxy_check(proxied, host, {"Cookie": f"x=a{first}"}) == 401
    assert proxy_check(proxied, host, {"Cookie": f"x={first}"}) == 401
    assert proxy_check(proxied, host, {"Cookie": f"gy_proxyx={value}"}) == 401
    assert proxy_check(proxied, host, {"Cookie": "gy_proxy=guessed"}) == 401
    # Another port's session does not open this one.
    public = redeem(proxied, cid, 7860)
    assert proxy_check(proxied, host, {"Cookie": public}) == 401
    # Revoked by the owner: every session of the port ends, and its unused links.
    with proxied.client() as c:
        unused = c.get(f"/v1/clusters/{cid}/ports/8888/open").json()["data"]["url"]
        r = c.delete(f"/v1/clusters/{cid}/ports/8888/sessions")
        assert r.status_code == 200, r.text
        assert r.json()["data"]["revoked"] == 3
        events = c.get(f"/v1/clusters/{cid}/events").json()["data"]["events"]
        assert any("sessions of port 8888 revoked (3)" in e["message"] for e in events)
    assert proxy_get(proxied, unused).status_code == 403
    with proxied.client(other_key(proxied)) as c:
        r = c.delete(f"/v1/clusters/{cid}/ports/8888/sessions")
        assert r.status_code == 404 and r.json()["error"]["code"] == "CLUSTER_NOT_FOUND"
    with proxied.client(own_key(proxied, Scope.READ, "viewer")) as c:
        r = c.delete(f"/v1/clusters/{cid}/ports/8888/sessions")
        assert r.status_code == 403 and r.json()["error"]["code"] == "FORBIDDEN"
    with proxied.client() as c:
        r = c.delete(f"/v1/clusters/{cid}/ports/22/sessions")
        assert r.status_code == 404 and r.json()["error"]["code"] == "NOT_FOUND"
    eventually(lambda: proxy_check(proxied, host, {"Cookie": second}) == 401)
    eventually(lambda: proxy_check(proxied, host, {"Cookie": first}) == 401)
    assert proxy_check(proxied, f"{cid}-7860.proxy.localhost:8080", {"Cookie": public}) == 200


def test_a_session_expires(proxied: LiveServer) -> None:
    with proxied.client() as c:
        cid = created(proxied, c, BODY)
    host = f"{cid}-8888.proxy.localhost:8080"
    proxied.server.app.state.gpuyard.proxy_sessions.ttl_s = 0.0  # no kept answers
    cookie = redeem(proxied, cid)
    assert proxy_check(proxied, host, {"Cookie": cookie}) == 200
    clock = proxied.server.ctx.clock
    real_now = clock.now
    later = real_now() + timedelta(hours=proxied.server.ctx.settings.proxy_session_hours + 1)
    clock.now = lambda: later  # type: ignore[method-assign]
    try:
        assert proxy_check(proxied, host, {"Cookie": cookie}) == 401
    finally:
        clock.now = real_now  # type: ignore[method-assign]


def test_a_removed_members_and_a_revoked_keys_sessions_are_refused(proxied: LiveServer) -> None:
    with proxied.client() as c:
        cid = created(proxied, c, BODY)
        aid = c.get("/v1/me").json()["data"]["acting"]["account_id"]
    host = f"{cid}-8888.proxy.localhost:8080"
    # A user with an account of their own, a member of this one: their key is of their
    # home account, so removing the membership revokes no key; the session must end.
    with proxied.server.ctx.transaction() as session:
        user, home, _ = create_account(session, email="dev@example.com", name="dev")
        dev_key = issue_key(
            session, user_id=user.id, account_id=home.id, name="dev", scope=Scope.WRITE
        ).key
    member_id = add_member(proxied, aid, user.id, "member")
    cookie = redeem(proxied, cid, key=dev_key, **{"X-Gpuyard-Account": str(aid)})
    assert proxy_check(proxied, host, {"Cookie": cookie}) == 200
    with proxied.client() as c:
        assert c.delete(f"/v1/accounts/{aid}/members/{member_id}").status_code == 200
    eventually(lambda: proxy_check(proxied, host, {"Cookie": cookie}) == 401)
    # A revoked key's session ends too.
    with proxied.client() as c:
        r = c.post("/v1/api-keys", json={"name": "second", "scope": "write"})
        assert r.status_code in (200, 201), r.text
        second, second_id = r.json()["data"]["key"], r.json()["data"]["id"]
    cookie = redeem(proxied, cid, key=second)
    assert proxy_check(proxied, host, {"Cookie": cookie}) == 200
    with proxied.client(second) as c:
        assert c.delete(f"/v1/api-keys/{second_id}").status_code == 200
    eventually(lambda: proxy_check(proxied, host, {"Cookie": cookie}) == 401)
    # The owner's own session is untouched.
    assert proxy_check(proxied, host, {"Cookie": redeem(proxied, cid)}) == 200


def test_open_link_expires(proxied: LiveServer) -> None:
    with proxied.client() as c:
        cid = created(proxied, c, BODY)
        link = c.get(f"/v1/clusters/{cid}/ports/8888/open").json()["data"]["url"]
    ttl = proxied.server.ctx.settings.proxy_link_ttl_s
    clock = proxied.server.ctx.clock
    real_now = clock.now
    later = real_now() + timedelta(seconds=ttl + 1)
    clock.now = lambda: later  # type: ignore[method-assign]
    try:
        assert proxy_get(proxied, link).status_code == 403
    finally:
        clock.now = real_now  # type: ignore[method-assign]


def test_who_may_open_a_port(proxied: LiveServer) -> None:
    with proxied.client() as c:
        cid = created(proxied, c, BODY)
    read = own_key(proxied, Scope.READ, "viewer")
    with proxied.client(read) as c:
        assert c.get(f"/v1/clusters/{cid}/ports/8888/open").json()["error"]["code"] == "FORBIDDEN"
    with proxied.client(other_key(proxied)) as c:
        r = c.get(f"/v1/clusters/{cid}/ports/8888/open")
        assert r.status_code == 404 and r.json()["error"]["code"] == "CLUSTER_NOT_FOUND"
    with proxied.client() as c:
        r = c.get(f"/v1/clusters/{cid}/ports/22/open")
        assert r.status_code == 404 and r.json()["error"]["code"] == "NOT_FOUND"
        r = c.get(f"/v1/clusters/{cid}/ports/0/open")
        assert r.status_code == 400 and r.json()["error"]["code"] == "VALIDATION_ERROR"
        assert c.get(f"/v1/clusters/{cid}/ports/8888/open", params={"token": ""}).status_code == 400
        proxied.server.ctx.proxy.set(False, "Caddy refused the proxy configuration: busy")
        r = c.get(f"/v1/clusters/{cid}/ports/8888/open")
        assert r.status_code == 503 and r.json()["error"]["code"] == "PROXY_UNAVAILABLE"
        expected(proxied, 503)
    assert (
        httpx.get(
            f"{proxied.url}/v1/clusters/{cid}/ports/8888/open", verify=trusted_tls()
        ).status_code
        == 401
    )


def test_the_proxy_key_check(proxied: LiveServer) -> None:
    with proxied.client() as c:
        cid = created(proxied, c, BODY)
    host = f"{cid}-8888.proxy.localhost:8080"

    def check(headers: dict[str, str], forwarded: str = host) -> int:
        r = httpx.get(
            f"{proxied.url}/v1/proxy/authorize",
            headers={"X-Forwarded-Host": forwarded, **headers},
            verify=trusted_tls(),
        )
        return r.status_code

    assert check({"Authorization": f"Bearer {proxied.key}"}) == 200
    assert check({"X-Gpuyard-Api-Key": proxied.key}) == 200
    assert check({"Authorization": f"Bearer {other_key(proxied)}"}) == 404
    assert check({"Authorization": "Bearer gy_wrong"}) == 401
    # A read key does not open a private port (a notebook runs code).
    assert check({"Authorization": f"Bearer {own_key(proxied, Scope.READ, 'viewer')}"}) == 403
    assert check({}) == 401
    assert check({"Authorization": f"Bearer {proxied.key}"}, f"{cid}-22.proxy.localhost") == 404
    assert check({"Authorization": f"Bearer {proxied.key}"}, "elsewhere.example.com") == 404
    # A public port lets anybody through, whatever the request carries.
    public = f"{cid}-7860.proxy.localhost:8080"
    for headers in (
        {},
        {"Authorization": f"Bearer {other_key(proxied, 'third@example.com')}"},
        {"Authorization": "Bearer gy_wrong"},
        {"Cookie": "gy_proxy=stale"},
    ):
        assert check(headers, public) == 200, headers


def test_the_status_page(proxied: LiveServer) -> None:
    with proxied.client() as c:
        cid = created(proxied, c, BODY)

        def page(host: str) -> httpx.Response:
            return httpx.get(
                f"{proxied.url}/v1/proxy/unavailable", headers={"Host": host}, verify=trusted_tls()
            )

        r = page(f"{cid}-8888.proxy.localhost:8080")
        assert r.status_code == 502 and "running, but nothing answers" in r.text
        expected(proxied, 502)
        assert page(f"{cid}-22.proxy.localhost").status_code == 404  # not an http port
        assert c.post(f"/v1/clusters/{cid}/stop").status_code == 200
        assert proxied.server.reconciler.wait_idle(10)
        r = page(f"{cid}-8888.proxy.localhost:8080")
        assert r.status_code == 502 and f"Cluster {cid} is stopped" in r.text
        expected(proxied, 502)
        assert page("nothing.proxy.localhost").status_code == 404
        assert c.delete(f"/v1/clusters/{cid}").status_code == 200
        assert proxied.server.reconciler.wait_idle(10)
        assert page(f"{cid}-8888.proxy.localhost:8080").status_code == 404


class FakeCaddy:
    """The admin API of a Caddy that may have restarted (empty) or refuse a load."""

    def __init__(self) -> None:
        self.config: dict[str, Any] | None = None
        self.loads = 0
        self.refuse: str | None = None

    def current(self) -> dict[str, Any] | None:
        return self.config

    def load(self, config: dict[str, Any]) -> None:
        if self.refuse:
            raise CaddyError(self.refuse)
        self.config, self.loads = config, self.loads + 1


class FakeResolver:
    """The proxy's resolver: its table, and the port it answers on."""

    def __init__(self, table: Path) -> None:
        self.table = table
        self.markers = table.parent / "routes"
        self.port = 5300

    def ensure(self) -> int:
        return self.port

    def stop(self) -> None:
        pass


def test_sync_writes_routes_and_loads_only_settings(srv: LiveServer, tmp_path: Path) -> None:
    caddy = FakeCaddy()
    resolver = FakeResolver(tmp_path / "routes.json")
    admin = SimpleNamespace(config=caddy.current, load=caddy.load, close=lambda: None)
    listen = ProxyListen("127.0.0.1", 8080, "127.0.0.1:8000", "unix//x")
    base = ProxyBase("http", "proxy.localhost", 8080)
    sync = ProxySync(srv.server.ctx, admin, listen, base, resolver=resolver)  # type: ignore[arg-type]
    assert srv.server.ctx.proxy.problem() is not None
    assert sync.sync() and caddy.loads == 1
    assert srv.server.ctx.proxy.problem() is None
    assert parse_table(resolver.table.read_bytes()) == {}
    assert sync.sync() and caddy.loads == 1  # nothing changed: nothing loaded
    with srv.client() as c:
        cid = created(srv, c, BODY)
        # A new cluster's ports reach the resolver's table; Caddy loads nothing.
        assert sync.sync(check_caddy=False) and sync.sync() and caddy.loads == 1
        table = parse_table(resolver.table.read_bytes())
        assert set(table) == {f"{cid}-8888", f"{cid}-7860"}
        assert table[f"{cid}-7860"].public and not table[f"{cid}-8888"].public
        assert (resolver.markers / "public" / f"{cid}-7860").exists()
        assert (resolver.markers / "private" / f"{cid}-8888").exists()
        assert cid not in json.dumps(caddy.config)
        assert c.delete(f"/v1/clusters/{cid}").status_code == 200
        assert srv.server.reconciler.wait_idle(10)
    assert sync.sync(check_caddy=False) and caddy.loads == 1
    assert parse_table(resolver.table.read_bytes()) == {}
    assert not list((resolver.markers / "private").iterdir())
    caddy.config = None  # Caddy restarted empty
    # A pass woken by a change asks Caddy nothing ...
    assert sync.sync(check_caddy=False) and caddy.loads == 1
    # ... the periodic pass finds the empty Caddy and loads it again.
    assert sync.sync() and caddy.loads == 2
    # A resolver started again on another port: Caddy is told where it is.
    resolver.port = 5301
    assert sync.sync(check_caddy=False) and caddy.loads == 3
    assert "udp/127.0.0.1:5301" in json.dumps(caddy.config)
    caddy.refuse = "listen tcp 127.0.0.1:8080: bind: address already in use"
    caddy.config = None
    assert not sync.sync()
    assert srv.server.ctx.proxy.problem() == caddy.refuse
    with srv.client() as c:
        cid = created(srv, c, BODY)
        assert c.get(f"/v1/clusters/{cid}").json()["data"]["network"]["proxy_url"] is None


def test_cli_open_and_public_ports(proxied: LiveServer) -> None:
    from tests.api.test_cli import ok_json, run

    created = ok_json(
        run(
            proxied, "clusters", "create", "--image", "img", "--gpu-type", "NVIDIA RTX A6000",
            "--port", "8888/http", "--port", "7860/http,public", "--json",
        )
    )  # fmt: skip
    cid = created["id"]
    assert [p["visibility"] for p in created["ports"]] == ["private", "public"]
    assert proxied.server.reconciler.wait_idle(10)
    shown = run(proxied, "clusters", "get", cid)
    assert f"(private: http://{cid}-8888.proxy.localhost:8080)" in shown.output
    assert f"(public: http://{cid}-7860.proxy.localhost:8080)" in shown.output
    opened = run(proxied, "clusters", "open", cid)
    assert opened.exit_code == 0, opened.output
    link = opened.output.strip().splitlines()[-1]
    assert link.startswith(f"http://{cid}-8888.proxy.localhost:8080/v1/clusters/{cid}/ports/8888/")
    assert proxy_get(proxied, link).status_code == 302
    assert ok_json(run(proxied, "clusters", "open", cid, "--port", "7860", "--json"))["url"]
    bad = run(proxied, "clusters", "create", "--image", "i", "--port", "22/tcp,public")
    assert bad.exit_code != 0 and "only an http port" in bad.output


class FakeForwards:
    """Forwards to ssh:// hosts' loopback, as the proxy sync sets them up."""

    def __init__(self) -> None:
        self.kept: set[tuple[str, int]] = set()

    def upstream(self, url: str, port: int) -> str:
        return f"unix//fwd/{url.rsplit('@', 1)[-1]}-{port}.sock"

    def retain(self, wanted: set[tuple[str, int]]) -> None:
        self.kept = set(wanted)


def test_private_ports_are_on_loopback_where_the_proxy_reaches_loopback(tmp_path: Path) -> None:
    runtime = FakeRuntime()
    # A tcp:// host with a private http port is refused unless the operator allows it
    # (tests/service/test_exposed_private_ports.py); allowed here to see its binding.
    settings = make_settings(
        tmp_path / "home", heartbeat_interval_s=3600, allow_exposed_private_ports=True
    )
    with live_server(settings, runtime) as srv, srv.client() as c:
        assert c.post("/v1/hosts/1/cordon").status_code == 200
        urls = {"ssh": "ssh://root@10.0.0.9", "tcp": "tcp://10.0.0.8:2375"}
        tls = tmp_path / "tls"  # the fake runtime never opens it
        tls.mkdir()
        for pem in ("ca.pem", "cert.pem", "key.pem"):
            (tls / pem).write_text("x")
        for name, url in urls.items():
            extra = {"engine_tls_dir": str(tls)} if name == "tcp" else {}
            r = c.post(
                "/v1/hosts",
                json={"name": name, "engine_url": url, "gpus": "NVIDIA RTX A6000:1",
                      "vcpus": 8, "memory_gb": 64, "disk_gb": 500, **extra},
            )  # fmt: skip
            assert r.status_code == 201, r.text
        srv.server.reconciler.heartbeat_now()
        placed: dict[str, str] = {}
        for _ in urls:
            cid = created(srv, c, {**BODY, "gpu_count": 1})
            host = c.get(f"/v1/clusters/{cid}").json()["data"]["host"]["name"]
            placed[host] = cid
        assert set(placed) == {"ssh", "tcp"}
        assert srv.server.reconciler.wait_idle(10)

        def bound(cid: str) -> dict[int, str | None]:
            spec = runtime.containers[cid].spec
            return {p.internal_port: p.host_ip for p in spec.ports}

        # ssh://: the private http port on the host's loopback, the rest on every address.
        assert bound(placed["ssh"]) == {8888: "127.0.0.1", 7860: None, 22: None}
        # tcp://: no way for the proxy to reach the host's loopback.
        assert bound(placed["tcp"]) == {8888: None, 7860: None, 22: None}

        forwards = FakeForwards()
        routes = {
            (r.cluster_id, r.internal_port): r.upstream
            for r in load_routes(srv.server.ctx, forwards)
        }
        ports = {
            p["internal_port"]: p["external_port"]
            for p in c.get(f"/v1/clusters/{placed['ssh']}").json()["data"]["network"]["ports"]
        }
        assert routes[(placed["ssh"], 8888)] == f"unix//fwd/10.0.0.9-{ports[8888]}.sock"
        assert routes[(placed["ssh"], 7860)] == f"10.0.0.9:{ports[7860]}"
        assert routes[(placed["tcp"], 8888)].startswith("10.0.0.8:")
        assert forwards.kept == {(urls["ssh"], ports[8888])}
        # Terminated: its forward is no longer wanted.
        assert c.delete(f"/v1/clusters/{placed['ssh']}").status_code == 200
        assert srv.server.reconciler.wait_idle(10)
        load_routes(srv.server.ctx, forwards)
        assert forwards.kept == set()
