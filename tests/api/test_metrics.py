"""``GET /metrics``: store gauges at scrape time, API latency, reconciler passes,
auto-terminations by rule, and who may scrape (an admin-scope key or the metrics
token by default; anyone only when GPUYARD_METRICS_PUBLIC is set)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuyard.core.autoterm import Rule
from gpuyard.core.tls_trust import trusted_tls
from gpuyard.observability.counters import record_auto_termination
from gpuyard.reconciler.duties.autoterminate import Fired
from gpuyard.services.clock import SystemClock
from gpuyard.services.tenancy.auth import Scope, create_account, issue_key
from gpuyard.testing.fake_runtime import FakeRuntime
from tests.helpers import LiveServer, live_server, make_settings

A6000 = "NVIDIA RTX A6000"
RTX4090 = "NVIDIA GeForce RTX 4090"
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(srv: LiveServer, **headers: str) -> Samples:
    """Scrape with ``headers`` (default: the admin key)."""
    r = httpx.get(
        srv.url + "/metrics",
        headers=headers or {"Authorization": f"Bearer {srv.key}"},
        verify=trusted_tls(),
    )
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(r.text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def scrape_when(srv: LiveServer, name: str, expected: float, **labels: str) -> Samples:
    """Scrape until ``name{labels}`` reaches ``expected``: a request is observed just
    after its response is sent, which may be a moment after the client read it."""
    deadline = time.monotonic() + 5
    while True:
        samples = scrape(srv)
        if samples.get((name, frozenset(labels.items()))) == expected:
            return samples
        if time.monotonic() > deadline:
            return samples
        time.sleep(0.05)


def create(srv: LiveServer, c: httpx.Client, gpu_type: str, gpu_count: int) -> dict[str, object]:
    body = {"gpu_type": gpu_type, "gpu_count": gpu_count, "docker_image": "img", "volume_gb": 50}
    r = c.post("/v1/clusters", json=body)
    assert r.status_code == 201, r.text
    assert srv.server.reconciler.wait_idle(10)
    data: dict[str, object] = c.get(f"/v1/clusters/{r.json()['data']['id']}").json()["data"]
    return data


def rate(cluster: dict[str, object]) -> float:
    cost = cluster["cost"]
    assert isinstance(cost, dict)
    return float(cost["hourly_rate"])


def test_store_gauges_after_creating_clusters(srv: LiveServer) -> None:
    empty = scrape(srv)
    assert value(empty, "gpuyard_clusters", status="running") == 0
    assert value(empty, "gpuyard_gpus_free", gpu_type=A6000) == 4
    assert value(empty, "gpuyard_gpus_allocated", gpu_type=A6000) == 0
    assert value(empty, "gpuyard_spend_rate_per_hour", status="running", currency="USD") == 0
    assert value(empty, "gpuyard_metrics_store_up") == 1

    with srv.client() as c:
        a = create(srv, c, A6000, 2)
        b = create(srv, c, RTX4090, 1)
        stopped = create(srv, c, A6000, 1)
        assert c.post(f"/v1/clusters/{stopped['id']}/stop").status_code == 200
        assert srv.server.reconciler.wait_idle(10)
        stopped = c.get(f"/v1/clusters/{stopped['id']}").json()["data"]
    assert a["status"] == b["status"] == "running" and stopped["status"] == "stopped"

    m = scrape(srv)
    assert value(m, "gpuyard_clusters", status="running") == 2
    assert value(m, "gpuyard_clusters", status="stopped") == 1
    assert value(m, "gpuyard_clusters", status="error") == 0
    assert value(m, "gpuyard_gpus_allocated", gpu_type=A6000) == 2
    assert value(m, "gpuyard_gpus_free", gpu_type=A6000) == 2
    assert value(m, "gpuyard_gpus_allocated", gpu_type=RTX4090) == 1
    assert value(m, "gpuyard_gpus_free", gpu_type=RTX4090) == 3
    running = value(m, "gpuyard_spend_rate_per_hour", status="running", currency="USD")
    assert running > 0
    assert running == pytest.approx(rate(a) + rate(b), abs=1e-6)
    resting = value(m, "gpuyard_spend_rate_per_hour", status="stopped", currency="USD")
    assert resting > 0  # a stopped cluster still pays for its volume
    assert resting == pytest.approx(rate(stopped), abs=1e-6)


def test_api_latency_by_route_template(srv: LiveServer) -> None:
    with srv.client() as c:
        cid = create(srv, c, A6000, 1)["id"]
        for _ in range(3):
            assert c.get(f"/v1/clusters/{cid}").status_code == 200  # the fast path
        assert c.get("/v1/clusters/nope").status_code == 404
        assert c.get("/no/such/route").status_code == 404
        assert c.get("/v1/clusters").status_code == 200
    hist = "gpuyard_http_request_duration_seconds"
    one = "/v1/clusters/{cluster_id}"
    m = scrape_when(srv, f"{hist}_count", 1, method="GET", route="/v1/clusters", status="200")
    # create() also read the cluster once.
    assert value(m, f"{hist}_count", method="GET", route=one, status="200") == 4
    assert value(m, f"{hist}_count", method="GET", route=one, status="404") == 1
    assert value(m, f"{hist}_count", method="GET", route="other", status="404") == 1
    assert value(m, f"{hist}_count", method="POST", route="/v1/clusters", status="201") == 1
    assert value(m, f"{hist}_count", method="GET", route="/v1/clusters", status="200") == 1
    assert value(m, f"{hist}_sum", method="GET", route=one, status="200") > 0
    # The scrapes are timed too.
    m = scrape_when(srv, f"{hist}_count", 1, method="GET", route="/metrics", status="200")
    assert value(m, f"{hist}_count", method="GET", route="/metrics", status="200") >= 1


def test_reconciler_passes_are_measured(srv: LiveServer) -> None:
    deadline = time.monotonic() + 5
    while True:  # the loop runs every 0.2 s in tests
        m = scrape(srv)
        passes = value(m, "gpuyard_reconciler_pass_duration_seconds_count")
        if passes >= 2 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert passes >= 2
    # Both are observed after each pass (a scrape may fall between the two).
    lags = value(m, "gpuyard_reconciler_loop_lag_seconds_count")
    assert lags in (passes, passes + 1)
    assert value(m, "gpuyard_reconciler_loop_lag_seconds_bucket", le="+Inf") == lags
    assert 0 <= value(m, "gpuyard_reconciler_loop_lag_seconds_sum") < lags


def test_auto_terminations_by_rule(srv: LiveServer) -> None:
    m = scrape(srv)
    for rule in Rule:
        assert value(m, "gpuyard_auto_terminations_total", rule=rule.value) == 0
    ctx = srv.server.ctx
    # What the auto-terminator reports when a rule fires (wired in build_server) ...
    fire = srv.server.reconciler.autoterm.on_fire
    assert fire is not None
    now = SystemClock().now()
    fire(Fired("c1", Rule.COST_LIMIT, now, now))
    fire(Fired("c2", Rule.COST_LIMIT, now, now))
    # ... and the helper any other code calls.
    record_auto_termination(ctx, Rule.IDLE)
    record_auto_termination(ctx, "max_runtime")
    record_auto_termination(None, "idle")  # no server: nothing to count, no error
    m = scrape(srv)
    assert value(m, "gpuyard_auto_terminations_total", rule="cost_limit") == 2
    assert value(m, "gpuyard_auto_terminations_total", rule="idle") == 1
    assert value(m, "gpuyard_auto_terminations_total", rule="max_runtime") == 1


def key_of_scope(srv: LiveServer, scope: Scope) -> str:
    """A key of ``scope`` for a new, ordinary (non-admin) user."""
    with srv.server.ctx.transaction() as session:
        user, account, _ = create_account(session, email=f"{scope}@example.com", name="u")
        return issue_key(session, user_id=user.id, account_id=account.id, name="k", scope=scope).key


def test_metrics_need_an_admin_key_by_default(srv: LiveServer) -> None:
    url = srv.url + "/metrics"
    missing = httpx.get(url, verify=trusted_tls())
    assert missing.status_code == 401
    assert missing.headers["www-authenticate"] == "Bearer"
    assert missing.json()["error"]["code"] == "UNAUTHORIZED"
    assert "gpuyard_" not in missing.text
    assert (
        httpx.get(
            url, headers={"Authorization": "Bearer gy_not-a-key"}, verify=trusted_tls()
        ).status_code
        == 401
    )
    for scope in (Scope.READ, Scope.WRITE):
        refused = httpx.get(
            url,
            headers={"Authorization": f"Bearer {key_of_scope(srv, scope)}"},
            verify=trusted_tls(),
        )
        assert refused.status_code == 403, refused.text
        assert refused.json()["error"]["code"] == "FORBIDDEN"
        assert "gpuyard_" not in refused.text
    admin = scrape(srv)
    assert value(admin, "gpuyard_metrics_store_up") == 1
    # Every accepted spelling of the key works here as on the API.
    assert httpx.get(url, params={"api_key": srv.key}, verify=trusted_tls()).status_code == 200
    assert (
        httpx.get(url, headers={"Authorization": srv.key}, verify=trusted_tls()).status_code == 200
    )


@pytest.fixture
def token_srv(
    tmp_path: Path, fake_runtime: FakeRuntime, monkeypatch: pytest.MonkeyPatch
) -> Iterator[LiveServer]:
    monkeypatch.setenv("GPUYARD_METRICS_TOKEN", "s3cret-scrape")
    with live_server(make_settings(tmp_path / "home"), fake_runtime) as server:
        yield server


def test_token_or_admin_key(token_srv: LiveServer) -> None:
    url = token_srv.url + "/metrics"
    missing = httpx.get(url, verify=trusted_tls())
    assert missing.status_code == 401
    assert missing.headers["www-authenticate"] == "Bearer"
    assert missing.json()["error"]["code"] == "UNAUTHORIZED"
    assert (
        httpx.get(url, headers={"Authorization": "Bearer wrong"}, verify=trusted_tls()).status_code
        == 401
    )
    # The token is not an API key, and a user's key is not the token.
    assert (
        httpx.get(
            token_srv.url + "/v1/clusters",
            headers={"Authorization": "Bearer s3cret-scrape"},
            verify=trusted_tls(),
        ).status_code
        == 401
    )
    user = key_of_scope(token_srv, Scope.WRITE)
    assert (
        httpx.get(
            url, headers={"Authorization": f"Bearer {user}"}, verify=trusted_tls()
        ).status_code
        == 403
    )
    m = scrape(token_srv, Authorization="Bearer s3cret-scrape")
    assert value(m, "gpuyard_metrics_store_up") == 1
    assert value(scrape(token_srv), "gpuyard_metrics_store_up") == 1  # the admin key


def test_public_setting_opens_metrics(tmp_path: Path, fake_runtime: FakeRuntime) -> None:
    settings = make_settings(tmp_path / "home", metrics_public=True)
    with live_server(settings, fake_runtime) as server:
        assert value(scrape(server, Accept="text/plain"), "gpuyard_metrics_store_up") == 1


def test_disabled_metrics_are_not_served(tmp_path: Path, fake_runtime: FakeRuntime) -> None:
    settings = make_settings(tmp_path / "home", metrics_enabled=False)
    with live_server(settings, fake_runtime) as server:
        r = httpx.get(
            server.url + "/metrics",
            headers={"Authorization": f"Bearer {server.key}"},
            verify=trusted_tls(),
        )
        assert r.status_code == 404


def test_metrics_are_per_server(tmp_path: Path) -> None:
    """Two servers in one process keep separate registries."""
    with (
        live_server(make_settings(tmp_path / "one"), FakeRuntime()) as one,
        live_server(make_settings(tmp_path / "two"), FakeRuntime()) as two,
    ):
        record_auto_termination(one.server.ctx, "idle")
        assert value(scrape(one), "gpuyard_auto_terminations_total", rule="idle") == 1
        assert value(scrape(two), "gpuyard_auto_terminations_total", rule="idle") == 0


def test_metrics_not_in_openapi(srv: LiveServer) -> None:
    assert (
        "/metrics"
        not in httpx.get(srv.url + "/openapi.json", timeout=60, verify=trusted_tls()).json()[
            "paths"
        ]
    )
