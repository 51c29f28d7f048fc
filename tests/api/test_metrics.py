"""``GET /metrics``: store gauges at scrape time, API latency, reconciler passes,
auto-terminations by rule and the optional scrape token."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuyard.core.autoterm import Rule
from gpuyard.observability.counters import record_auto_termination
from gpuyard.reconciler.autoterminate import Fired
from gpuyard.runtimes.fake import FakeRuntime
from gpuyard.services.clock import SystemClock
from tests.helpers import LiveServer, live_server, make_settings

A6000 = "NVIDIA RTX A6000"
RTX4090 = "NVIDIA GeForce RTX 4090"
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(srv: LiveServer, **headers: str) -> Samples:
    r = httpx.get(srv.url + "/metrics", headers=headers)
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
    assert value(m, f"{hist}_count", method="GET", route="/metrics", status="200") == 1


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


@pytest.fixture
def token_srv(
    tmp_path: Path, fake_runtime: FakeRuntime, monkeypatch: pytest.MonkeyPatch
) -> Iterator[LiveServer]:
    monkeypatch.setenv("GPUYARD_METRICS_TOKEN", "s3cret-scrape")
    with live_server(make_settings(tmp_path / "home"), fake_runtime) as server:
        yield server


def test_token_restricts_metrics(token_srv: LiveServer) -> None:
    url = token_srv.url + "/metrics"
    missing = httpx.get(url)
    assert missing.status_code == 401
    assert missing.headers["www-authenticate"] == "Bearer"
    assert missing.json()["error"]["code"] == "UNAUTHORIZED"
    assert httpx.get(url, headers={"Authorization": "Bearer wrong"}).status_code == 401
    # An API key is not the metrics token.
    api_key = {"Authorization": f"Bearer {token_srv.key}"}
    assert httpx.get(url, headers=api_key).status_code == 401
    m = scrape(token_srv, Authorization="Bearer s3cret-scrape")
    assert value(m, "gpuyard_metrics_store_up") == 1


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
    assert "/metrics" not in httpx.get(srv.url + "/openapi.json").json()["paths"]
