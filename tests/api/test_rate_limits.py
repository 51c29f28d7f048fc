"""Rate limits (api/http/rate_limit.py): per key, per source address and on failed keys, on
every surface (the GET fast path included), 429 with Retry-After and X-RateLimit-* in
the surface's envelope. The limiter's clock is a FakeClock: nothing here sleeps."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from fastapi.testclient import TestClient

from gpuyard.api.app import Server, build_server
from gpuyard.services.clock import FakeClock
from gpuyard.services.tenancy.auth import Scope, create_account, issue_key
from gpuyard.testing.fake_runtime import FakeRuntime
from tests.helpers import make_settings

OFF = {
    "rate_limit_per_key": 0,
    "rate_limit_per_source": 0,
    "rate_limit_auth_failures_per_minute": 0,
}
GRAPHQL = {"query": "{ myself { id } }"}
TRAINING = "/distributed_jobs_v2/?project_id=1&location=local"


def _server(tmp_path: Path, clock: FakeClock, **limits: object) -> Server:
    settings = make_settings(tmp_path / "home", **{**OFF, **limits})
    return build_server(settings, FakeRuntime(), run_reconciler=False, rate_limit_clock=clock)


@contextmanager
def _client(server: Server, key: str | None, address: str = "203.0.113.5") -> Iterator[TestClient]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    with TestClient(server.app, client=(address, 40000), headers=headers) as client:
        yield client


def _second_key(server: Server) -> str:
    with server.ctx.transaction() as session:
        user, account, _ = create_account(session, email="bob@example.com", name="bob")
        issued = issue_key(
            session, user_id=user.id, account_id=account.id, name="b", scope=Scope.WRITE
        )
    return issued.key


def _assert_refused(r: httpx.Response, limit: str, retry_after: int) -> None:
    assert r.status_code == 429, r.text
    assert r.headers["retry-after"] == str(retry_after)
    assert r.headers["x-ratelimit-remaining"] == "0"
    assert {"x-ratelimit-limit", "x-ratelimit-reset"} <= set(r.headers)


def test_a_key_over_its_limit_gets_429_in_the_rest_envelope_until_tokens_return(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    server = _server(tmp_path, clock, rate_limit_per_key=1, rate_limit_key_burst=3)
    assert server.admin_key is not None
    with _client(server, server.admin_key.key) as c:
        answers = [c.get("/v1/projects") for _ in range(3)]
        assert [r.status_code for r in answers] == [200, 200, 200]
        # Answers let through say where the key stands.
        assert [r.headers["x-ratelimit-remaining"] for r in answers] == ["2", "1", "0"]
        assert {r.headers["x-ratelimit-limit"] for r in answers} == {"3"}
        assert answers[-1].headers["x-ratelimit-reset"] == "3"
        refused = c.get("/v1/projects")
        _assert_refused(refused, "key", retry_after=1)
        body = refused.json()
        assert body["success"] is False
        assert body["error"]["code"] == "RATE_LIMITED"
        assert body["error"]["details"] == {"limit": "key", "retry_after_s": 1}
        assert "request_id" in body["meta"]
        clock.advance(1)
        assert c.get("/v1/projects").status_code == 200


def test_the_cluster_fast_path_is_limited_too(tmp_path: Path) -> None:
    clock = FakeClock()
    server = _server(tmp_path, clock, rate_limit_per_key=1, rate_limit_key_burst=2)
    assert server.admin_key is not None
    with _client(server, server.admin_key.key) as c:
        first = c.get("/v1/clusters/nosuchcluster00")
        assert first.status_code == 404 and first.headers["x-ratelimit-remaining"] == "1"
        assert c.get("/v1/clusters/nosuchcluster00").status_code == 404
        refused = c.get("/v1/clusters/nosuchcluster00")
        _assert_refused(refused, "key", retry_after=1)
        assert refused.json()["error"]["code"] == "RATE_LIMITED"


def test_graphql_is_refused_in_the_graphql_envelope(tmp_path: Path) -> None:
    clock = FakeClock()
    server = _server(tmp_path, clock, rate_limit_per_key=0.5, rate_limit_key_burst=1)
    assert server.admin_key is not None
    with _client(server, server.admin_key.key) as c:
        ok = c.post("/graphql", json=GRAPHQL)
        assert ok.status_code == 200 and "errors" not in ok.json()
        assert ok.headers["x-ratelimit-remaining"] == "0"
        refused = c.post("/graphql", json=GRAPHQL)
        _assert_refused(refused, "key", retry_after=2)
        [error] = refused.json()["errors"]
        assert error["extensions"]["code"] == "RATE_LIMITED"
        assert error["extensions"]["details"]["limit"] == "key"
        assert "retry after 2 s" in error["message"]


def test_the_training_api_is_refused_in_its_own_envelope(tmp_path: Path) -> None:
    clock = FakeClock()
    server = _server(tmp_path, clock, rate_limit_per_key=1, rate_limit_key_burst=1)
    assert server.admin_key is not None
    with _client(server, server.admin_key.key) as c:
        assert c.get(TRAINING).status_code != 429
        refused = c.get(TRAINING)
        _assert_refused(refused, "key", retry_after=1)
        body = refused.json()
        assert body["code"] == 429 and body["errors"]["code"] == "RATE_LIMITED"


def test_another_key_is_not_held_back_by_one_over_its_limit(tmp_path: Path) -> None:
    clock = FakeClock()
    server = _server(tmp_path, clock, rate_limit_per_key=1, rate_limit_key_burst=2)
    assert server.admin_key is not None
    other = _second_key(server)
    with _client(server, server.admin_key.key) as busy, _client(server, other) as calm:
        for _ in range(2):
            assert busy.get("/v1/projects").status_code == 200
        assert busy.get("/v1/projects").status_code == 429
        answer = calm.get("/v1/projects")
        assert answer.status_code == 200 and answer.headers["x-ratelimit-remaining"] == "1"


def test_a_source_over_its_limit_is_refused_and_another_source_is_not(tmp_path: Path) -> None:
    clock = FakeClock()
    server = _server(tmp_path, clock, rate_limit_per_source=1, rate_limit_source_burst=2)
    assert server.admin_key is not None
    key = server.admin_key.key
    with _client(server, key) as near, _client(server, key, "198.51.100.7") as far:
        assert [near.get("/v1/projects").status_code for _ in range(2)] == [200, 200]
        refused = near.get("/v1/projects")
        _assert_refused(refused, "source", retry_after=1)
        assert refused.json()["error"]["details"]["limit"] == "source"
        # Requests without a key count against the address as well.
        assert near.get("/openapi.json", headers={"Authorization": ""}).status_code == 429
        assert far.get("/v1/projects").status_code == 200


def test_guessing_keys_from_one_source_is_throttled_after_the_allowance(tmp_path: Path) -> None:
    clock = FakeClock()
    server = _server(tmp_path, clock, rate_limit_auth_failures_per_minute=10)
    assert server.admin_key is not None
    key = server.admin_key.key
    with _client(server, None) as guesser, _client(server, key, "198.51.100.7") as elsewhere:

        def guess() -> httpx.Response:
            wrong = {"Authorization": f"Bearer gy_{secrets.token_urlsafe(30)}"}
            return guesser.get("/v1/projects", headers=wrong)

        assert [guess().status_code for _ in range(10)] == [401] * 10
        refused = guess()
        _assert_refused(refused, "auth_failures", retry_after=6)  # 10 a minute: one per 6 s
        assert refused.json()["error"]["details"]["limit"] == "auth_failures"
        # Other surfaces, and the query-parameter spelling, are refused as well.
        assert guesser.post("/graphql", json=GRAPHQL, params={"api_key": "x"}).status_code == 429
        # A valid key from the same source is answered normally (only bad keys are
        # locked out), and does not unlock the bad ones.
        assert (
            guesser.get("/v1/projects", headers={"Authorization": f"Bearer {key}"}).status_code
            == 200
        )
        assert guess().status_code == 429
        # Another source is not affected.
        assert elsewhere.get("/v1/projects").status_code == 200
        # One guess more per 6 s; after a minute the source is back to normal.
        clock.advance(6)
        assert guess().status_code == 401
        assert guess().status_code == 429
        clock.advance(60)
        assert (
            guesser.get("/v1/projects", headers={"Authorization": f"Bearer {key}"}).status_code
            == 200
        )


def test_failed_keys_count_on_graphql_and_the_fast_path_too(tmp_path: Path) -> None:
    clock = FakeClock()
    server = _server(tmp_path, clock, rate_limit_auth_failures_per_minute=2)
    with _client(server, "gy_wrong") as c:
        assert c.post("/graphql", json=GRAPHQL).status_code == 401
        assert c.get("/v1/clusters/nosuchcluster00").status_code == 401
        refused = c.post("/graphql", json=GRAPHQL)
        assert refused.status_code == 429
        assert refused.json()["errors"][0]["extensions"]["code"] == "RATE_LIMITED"


def test_requests_without_a_key_are_not_failed_keys(tmp_path: Path) -> None:
    clock = FakeClock()
    server = _server(tmp_path, clock, rate_limit_auth_failures_per_minute=1)
    with _client(server, None) as c:
        assert [c.get("/v1/projects").status_code for _ in range(5)] == [401] * 5


def test_healthz_is_never_limited(tmp_path: Path) -> None:
    clock = FakeClock()
    server = _server(tmp_path, clock, rate_limit_per_source=1, rate_limit_source_burst=1)
    with _client(server, None) as c:
        answers = [c.get("/healthz") for _ in range(20)]
        assert {r.status_code for r in answers} == {200}
        assert "x-ratelimit-limit" not in answers[0].headers


def test_limits_set_to_zero_never_answer_429(tmp_path: Path) -> None:
    clock = FakeClock()  # frozen: no token would ever come back
    server = _server(tmp_path, clock)
    assert server.admin_key is not None
    with _client(server, server.admin_key.key) as c:
        answers = [c.get("/v1/projects") for _ in range(300)]
        assert {r.status_code for r in answers} == {200}
        assert "x-ratelimit-limit" not in answers[0].headers
        wrong = {"Authorization": "Bearer gy_wrong"}
        assert {c.get("/v1/projects", headers=wrong).status_code for _ in range(30)} == {401}


def test_the_defaults_limit_a_flood_of_random_keys(tmp_path: Path) -> None:
    """The reproduction: 500 random-key guesses from one source used to get 0 x 429."""
    settings = make_settings(tmp_path / "home")
    server = build_server(
        settings, FakeRuntime(), run_reconciler=False, rate_limit_clock=FakeClock()
    )
    with _client(server, None) as c:
        codes = [
            c.get("/v1/projects", headers={"Authorization": f"Bearer gy_{i:040d}"}).status_code
            for i in range(500)
        ]
    assert codes.count(401) == settings.rate_limit_auth_failures_per_minute
    assert codes.count(429) == 500 - settings.rate_limit_auth_failures_per_minute


def test_a_key_in_the_query_string_shares_the_bucket_of_the_same_key_in_a_header(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    server = _server(tmp_path, clock, rate_limit_per_key=1, rate_limit_key_burst=2)
    assert server.admin_key is not None
    key = server.admin_key.key
    with _client(server, key) as by_header, _client(server, None) as by_query:
        assert by_header.get("/v1/projects").status_code == 200
        assert by_query.post("/graphql", json=GRAPHQL, params={"api_key": key}).status_code == 200
        refused = by_query.get(TRAINING + f"&apikey={key}")
        _assert_refused(refused, "key", retry_after=1)


def test_failed_console_sign_ins_count_like_failed_keys(tmp_path: Path) -> None:
    """The console's sign-in carries its key in the body: wrong keys there use up the
    source's allowance like wrong keys in a header, and once it is used up a sign-in
    with the right key is refused too, as is every request from there with a key."""
    clock = FakeClock()
    server = _server(tmp_path, clock, rate_limit_auth_failures_per_minute=3)
    assert server.admin_key is not None
    key = server.admin_key.key
    sign_in = "/v1/console/session"
    with _client(server, None) as guesser, _client(server, None, "198.51.100.7") as elsewhere:

        def guess() -> httpx.Response:
            return guesser.post(sign_in, json={"api_key": f"gy_{secrets.token_urlsafe(30)}"})

        assert [guess().status_code for _ in range(3)] == [401] * 3
        refused = guess()
        _assert_refused(refused, "auth_failures", retry_after=20)  # 3 a minute
        assert refused.json()["error"]["code"] == "RATE_LIMITED"
        # The right key signs in from there all the same, and is served.
        assert guesser.post(sign_in, json={"api_key": key}).status_code == 201
        header = {"Authorization": f"Bearer {key}"}
        assert guesser.get("/v1/projects", headers=header).status_code == 200
        assert guess().status_code == 429
        assert elsewhere.post(sign_in, json={"api_key": key}).status_code == 201
        # After the minute the allowance is back.
        clock.advance(60)
        # Bad keys in headers and bad sign-ins share one allowance.
        bad = {"Authorization": "Bearer gy_wrong"}
        assert [guesser.get("/v1/projects", headers=bad).status_code for _ in range(2)] == [401] * 2
        assert guess().status_code == 401
        assert guess().status_code == 429


def test_failed_keys_at_the_proxy_check_lock_the_source_out_as_at_the_api(
    tmp_path: Path,
) -> None:
    """The proxy's key check (/v1/proxy/authorize, reached through Caddy) counts a wrong
    key in either of its spellings, so guessing through the proxy locks the source out
    of the API and the proxy alike; the application's own Authorization is no key."""
    clock = FakeClock()
    server = _server(tmp_path, clock, rate_limit_auth_failures_per_minute=3)
    assert server.admin_key is not None
    key = server.admin_key.key
    host = {"X-Forwarded-Host": "abcdefghijklmn-8888.proxy.localhost"}
    with _client(server, None) as guesser:

        def check(headers: dict[str, str]) -> int:
            return guesser.get("/v1/proxy/authorize", headers={**host, **headers}).status_code

        # Basic auth (the application's own) is not a failed gpuyard key.
        assert [check({"Authorization": "Basic YTpi"}) for _ in range(5)] == [401] * 5
        assert (
            guesser.get("/v1/projects", headers={"Authorization": f"Bearer {key}"}).status_code
            == 200
        )
        guesses = [
            check({"X-Gpuyard-Api-Key": f"gy_{secrets.token_urlsafe(30)}"}) for _ in range(3)
        ]
        assert guesses == [401] * 3
        # Locked out for wrong keys at the API and the proxy check alike; the right
        # key is still served at both.
        refused = guesser.get("/v1/projects", headers={"Authorization": "Bearer gy_wrong"})
        _assert_refused(refused, "auth_failures", retry_after=20)
        assert check({"X-Gpuyard-Api-Key": "gy_wrong"}) == 429
        assert check({"X-Gpuyard-Api-Key": key}) != 429
        assert (
            guesser.get("/v1/projects", headers={"Authorization": f"Bearer {key}"}).status_code
            == 200
        )
        clock.advance(61)
        assert (
            guesser.get("/v1/projects", headers={"Authorization": f"Bearer {key}"}).status_code
            == 200
        )


def test_lockout_with_a_valid_key(tmp_path: Path) -> None:
    """Behind one address (an office NAT) a stranger's bad keys lock out bad keys only:
    a colleague's valid key from the same address is answered normally on every
    surface, while the next bad key still gets 429."""
    clock = FakeClock()
    server = _server(tmp_path, clock, rate_limit_auth_failures_per_minute=10)
    colleague = _second_key(server)
    with _client(server, None) as stranger, _client(server, colleague) as same_nat:
        bad = {"Authorization": f"Bearer gy_{secrets.token_urlsafe(30)}"}
        assert [stranger.get("/v1/projects", headers=bad).status_code for _ in range(10)] == [
            401
        ] * 10
        _assert_refused(stranger.get("/v1/projects", headers=bad), "auth_failures", 6)
        assert same_nat.get("/v1/projects").status_code == 200
        assert same_nat.get("/v1/me").status_code == 200
        assert same_nat.post("/graphql", json=GRAPHQL).json().get("errors") is None
        assert same_nat.get(TRAINING).status_code != 429  # (project 1 is not his)
        refused = stranger.post("/graphql", json=GRAPHQL, headers=bad)
        assert refused.status_code == 429
        assert refused.json()["errors"][0]["extensions"]["code"] == "RATE_LIMITED"
