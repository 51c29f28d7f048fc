"""The web console's session (api/console/session.py) over real HTTP: the cookie's
flags, the CSRF token required with the cookie, sign-out revoking the session, idle
expiry, wrong keys, and the WebSocket's token and Origin checks."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from sqlalchemy import update
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect as ws_connect

from gpuyard.core.sealed_key import secret_id
from gpuyard.core.tls_trust import trusted_tls
from gpuyard.services.tenancy.auth import Scope, issue_key
from gpuyard.store.console_sessions import ConsoleSession
from gpuyard.store.schema import ApiKey
from gpuyard.testing.fake_runtime import FakeRuntime
from tests.helpers import LiveServer, live_server, make_settings
from tests.unit.test_sealed_key import former_seal

PATH = "/v1/console/session"


@pytest.fixture
def srv(tmp_path: Path) -> Iterator[LiveServer]:
    settings = make_settings(
        tmp_path / "home",
        rate_limit_per_key=0,
        rate_limit_per_source=0,
        rate_limit_auth_failures_per_minute=0,
    )
    with live_server(settings, FakeRuntime()) as server:
        yield server


def browser(srv: LiveServer) -> httpx.Client:
    """A client with a cookie jar and no Authorization header, like the page."""
    return httpx.Client(base_url=srv.url, timeout=30, verify=trusted_tls())


def sign_in(c: httpx.Client, key: str) -> str:
    r = c.post(PATH, json={"api_key": key})
    assert r.status_code == 201, r.text
    token: str = r.json()["data"]["csrf_token"]
    return token


def test_sign_in_sets_an_httponly_strict_cookie_and_answers_the_csrf_token(
    srv: LiveServer,
) -> None:
    with browser(srv) as c:
        r = c.post(PATH, json={"api_key": srv.key})
        assert r.status_code == 201, r.text
        cookie = r.headers["set-cookie"]
        parts = [p.strip().lower() for p in cookie.split(";")]
        assert parts[0].startswith("gpuyard_console=")
        assert "httponly" in parts and "samesite=strict" in parts and "path=/" in parts
        assert "secure" not in parts  # plain http here; https adds it
        data = r.json()["data"]
        assert data["key"]["scope"] == "admin" and data["key"]["prefix"] == srv.key[:10]
        # The key is nowhere in the answer but its prefix, and not in the cookie.
        assert srv.key not in r.text and srv.key not in cookie
        token = data["csrf_token"]
        me = c.get("/v1/me", headers={"X-CSRF-Token": token})
        assert me.status_code == 200, me.text
        assert me.json()["data"]["user"]["email"] == "admin@localhost"
        who = c.get(PATH, headers={"X-CSRF-Token": token})
        assert who.status_code == 200 and who.json()["data"]["csrf_token"] == token


def test_the_database_holds_neither_the_key_nor_the_cookie(srv: LiveServer) -> None:
    with browser(srv) as c:
        sign_in(c, srv.key)
        secret = c.cookies["gpuyard_console"]
    with srv.server.ctx.read() as s:
        rows = s.query(ConsoleSession).all()
    assert len(rows) == 1
    assert rows[0].id == secret_id(secret) and secret not in rows[0].id
    assert srv.key not in rows[0].sealed_key and srv.key.encode().hex() != rows[0].sealed_key


def test_the_cookie_without_the_csrf_token_is_refused(srv: LiveServer) -> None:
    with browser(srv) as c:
        token = sign_in(c, srv.key)
        body = {"gpu_type": "NVIDIA RTX A6000", "docker_image": "img"}
        for method, path, json in (
            ("POST", "/v1/clusters", body),
            ("DELETE", "/v1/clusters/nocluster", None),
            ("GET", "/v1/clusters", None),
            ("POST", "/graphql", {"query": "{ myself { id } }"}),
        ):
            for headers in ({}, {"X-CSRF-Token": token + "x"}, {"X-CSRF-Token": ""}):
                r = c.request(method, path, json=json, headers=headers)
                if method == "GET" and not headers:
                    # A page opened by the browser: no key, as for anyone.
                    assert r.status_code == 401, (path, r.text)
                    continue
                assert r.status_code == 403, (method, path, headers, r.text)
                error = r.json()["error"]
                assert error["code"] == "FORBIDDEN" and error["details"]["field"] == "X-CSRF-Token"
        # Public pages open in the signed-in browser.
        for page in ("/openapi.json", "/healthz", "/docs"):
            assert c.get(page).status_code == 200, page
        # Nothing was created by the refused POSTs.
        listed = c.get("/v1/clusters", headers={"X-CSRF-Token": token}).json()["data"]
        assert listed["clusters"] == []
        made = c.post("/v1/clusters", json=body, headers={"X-CSRF-Token": token})
        assert made.status_code == 201, made.text


def test_an_authorization_header_wins_over_the_cookie(srv: LiveServer) -> None:
    with srv.server.ctx.transaction() as s:
        admin = s.query(ApiKey).filter_by(prefix=srv.key[:10]).one()
        reader = issue_key(
            s, user_id=admin.user_id, account_id=admin.account_id, name="r", scope=Scope.READ
        ).key
    with browser(srv) as c:
        sign_in(c, srv.key)
        r = c.post(
            "/v1/clusters",
            json={"gpu_type": "NVIDIA RTX A6000", "docker_image": "img"},
            headers={"Authorization": f"Bearer {reader}"},
        )
        assert r.status_code == 403 and "scope 'read'" in r.json()["error"]["message"]


def test_sign_out_revokes_the_session_for_every_copy_of_the_cookie(srv: LiveServer) -> None:
    with browser(srv) as c:
        token = sign_in(c, srv.key)
        secret = c.cookies["gpuyard_console"]
        refused = c.delete(PATH)  # sign-out too needs the token
        assert refused.status_code == 403
        r = c.delete(PATH, headers={"X-CSRF-Token": token})
        assert r.status_code == 200 and r.json()["data"]["revoked"] is True
        assert "gpuyard_console=" in r.headers["set-cookie"]
        assert "max-age=0" in r.headers["set-cookie"].lower()
    # A copy of the cookie kept elsewhere acts as nobody now.
    with httpx.Client(
        base_url=srv.url, cookies={"gpuyard_console": secret}, verify=trusted_tls()
    ) as thief:
        r = thief.get("/v1/me", headers={"X-CSRF-Token": token})
        assert r.status_code == 401 and r.json()["error"]["code"] == "UNAUTHORIZED"
        assert thief.get(PATH, headers={"X-CSRF-Token": token}).status_code == 401


def test_an_idle_session_expires(srv: LiveServer) -> None:
    with browser(srv) as c:
        token = sign_in(c, srv.key)
        assert c.get("/v1/me", headers={"X-CSRF-Token": token}).status_code == 200
        secret = c.cookies["gpuyard_console"]
        now = srv.server.ctx.clock.now()
        with srv.server.ctx.transaction() as s:
            s.execute(
                update(ConsoleSession)
                .where(ConsoleSession.id == secret_id(secret))
                .values(last_seen_at=now - timedelta(hours=12, minutes=1))
            )
        srv.server.app.state.console_sessions.forget()  # as after the cache's 5 s
        r = c.get("/v1/me", headers={"X-CSRF-Token": token})
        assert r.status_code == 401, r.text
        # Used within the limit, a session lives on (its last use moves forward).
        token = sign_in(c, srv.key)
        secret = c.cookies["gpuyard_console"]
        with srv.server.ctx.transaction() as s:
            s.execute(
                update(ConsoleSession)
                .where(ConsoleSession.id == secret_id(secret))
                .values(last_seen_at=now - timedelta(hours=11))
            )
        srv.server.app.state.console_sessions.forget()
        assert c.get("/v1/me", headers={"X-CSRF-Token": token}).status_code == 200
        with srv.server.ctx.read() as s:
            seen = s.get(ConsoleSession, secret_id(secret))
            assert seen is not None and seen.last_seen_at > now - timedelta(minutes=5)


def test_a_session_sealed_by_the_former_scheme_signs_in_again(srv: LiveServer) -> None:
    """A row whose key was sealed by the former XOR pad (before an upgrade) opens to no
    key: the cookie acts as nobody (401, never a 500) until the browser signs in again."""
    with browser(srv) as c:
        token = sign_in(c, srv.key)
        secret = c.cookies["gpuyard_console"]
        with srv.server.ctx.transaction() as s:
            s.execute(
                update(ConsoleSession)
                .where(ConsoleSession.id == secret_id(secret))
                .values(sealed_key=former_seal(srv.key, secret))
            )
        srv.server.app.state.console_sessions.forget()  # as after the cache's 5 s
        r = c.get("/v1/me", headers={"X-CSRF-Token": token})
        assert r.status_code == 401 and r.json()["error"]["code"] == "UNAUTHORIZED"
        assert c.get(PATH, headers={"X-CSRF-Token": token}).status_code == 401
        token = sign_in(c, srv.key)
        assert c.get("/v1/me", headers={"X-CSRF-Token": token}).status_code == 200


def test_a_wrong_key_is_refused_and_sets_no_cookie(srv: LiveServer) -> None:
    with browser(srv) as c:
        for key in ("gy_" + "x" * 40, "nonsense"):
            r = c.post(PATH, json={"api_key": key})
            assert r.status_code == 401, r.text
            assert r.json()["error"]["code"] == "UNAUTHORIZED"
            assert "set-cookie" not in r.headers
        for body in ({}, {"api_key": ""}, {"api_key": 5}, {"api_key": "k", "extra": 1}):
            r = c.post(PATH, json=body)
            assert r.status_code == 400, r.text
            assert r.json()["error"]["code"] == "VALIDATION_ERROR"
        # A form post from another site (text/plain, no preflight) signs nobody in.
        r = c.post(
            PATH, content=f'{{"api_key": "{srv.key}"}}', headers={"Content-Type": "text/plain"}
        )
        assert r.status_code == 400 and "set-cookie" not in r.headers
        r = c.post(PATH, json={"api_key": srv.key}, headers={"Origin": "http://evil.test"})
        assert r.status_code == 403 and "set-cookie" not in r.headers
        assert c.get(PATH).status_code == 401


def test_a_revoked_api_key_ends_what_its_session_can_do(srv: LiveServer) -> None:
    with srv.server.ctx.transaction() as s:
        admin = s.query(ApiKey).filter_by(prefix=srv.key[:10]).one()
        key = issue_key(
            s, user_id=admin.user_id, account_id=admin.account_id, name="w", scope=Scope.WRITE
        )
    with browser(srv) as c:
        token = sign_in(c, key.key)
        assert c.get("/v1/me", headers={"X-CSRF-Token": token}).status_code == 200
        with srv.client() as admin_client:
            assert admin_client.delete(f"/v1/api-keys/{key.id}").status_code == 200
        srv.server.app.state.gpuyard.keys.clear()  # as after the key cache's 5 s
        assert c.get("/v1/me", headers={"X-CSRF-Token": token}).status_code == 401


def test_the_terminal_websocket_needs_the_token_and_this_origin(srv: LiveServer) -> None:
    with browser(srv) as c:
        token = sign_in(c, srv.key)
        secret = c.cookies["gpuyard_console"]
    host = srv.url.removeprefix("http://")
    url = f"ws://{host}/v1/clusters/nocluster0000/terminal"
    cookie = f"gpuyard_console={secret}"

    def status(origin: str, protocols: list[str]) -> int:
        try:
            with ws_connect(
                url,
                additional_headers={"Cookie": cookie, "Origin": origin},
                subprotocols=protocols,  # type: ignore[arg-type]
                open_timeout=10,
            ):
                return 101
        except InvalidStatus as exc:
            return int(exc.response.status_code)

    terminal = "gpuyard.terminal.v1"
    assert status(srv.url, [terminal]) == 403
    assert status(srv.url, [terminal, "gpuyard.csrf.wrong"]) == 403
    assert status("http://evil.test", [terminal, f"gpuyard.csrf.{token}"]) == 403
    # With both, the session is the caller: the route itself answers (no such cluster).
    assert status(srv.url, [terminal, f"gpuyard.csrf.{token}"]) == 404


def test_a_junk_cookie_is_looked_up_once_per_cache_period(srv: LiveServer) -> None:
    cache = srv.server.app.state.console_sessions
    junk = "j" * 43
    with httpx.Client(
        base_url=srv.url, cookies={"gpuyard_console": junk}, verify=trusted_tls()
    ) as c:
        for _ in range(3):
            r = c.get("/v1/me", headers={"X-CSRF-Token": "t"})
            assert r.status_code == 401 and r.json()["error"]["code"] == "UNAUTHORIZED"
    # The miss is kept (no session behind it), so repeats do not read the table, and
    # apart from live sessions: junk never pushes one out.
    assert secret_id(junk) in cache._misses and secret_id(junk) not in cache._entries
    # A real session still signs in and works next to it.
    with browser(srv) as c:
        token = sign_in(c, srv.key)
        assert c.get("/v1/me", headers={"X-CSRF-Token": token}).status_code == 200
