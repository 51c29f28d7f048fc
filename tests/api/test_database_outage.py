"""Requests while the database is away (a PostgreSQL failover, a restart) are answered
503 DATABASE_UNAVAILABLE with Retry-After in each surface's envelope, never a 500; the
server answers again by itself once the database is back, and a create retried with its
Idempotency-Key is made once.

The real app over real HTTP on PostgreSQL (skipped without GPUYARD_TEST_POSTGRES_URL),
reached through a TCP gate the test cuts: open connections are reset and new ones
refused, as when the primary's node crashes. (tests/e2e/test_database_failover.py does
the same through a real Patroni failover.)
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy.engine import make_url

from gpuyard.testing.fake_runtime import FakeRuntime
from tests.helpers import LiveServer, live_server, make_settings
from tests.tcp_gate import TcpGate

CLUSTER = {
    "name": "outage",
    "gpu_type": "NVIDIA RTX A6000",
    "gpu_count": 1,
    "docker_image": "localhost/gpuyard/busybox:latest",
    "volume_gb": 1,
}
GRAPHQL_LIST = {"query": "query { myself { clusters { id } } }"}
BACK_WITHIN_S = 60.0


@pytest.fixture
def gate(database_url: str) -> Iterator[TcpGate]:
    url = make_url(database_url)
    if url.get_backend_name() != "postgresql":
        pytest.skip("a database server to lose: PostgreSQL only")
    g = TcpGate((url.host or "127.0.0.1", url.port or 5432))
    yield g
    g.close()


@pytest.fixture
def gated_srv(database_url: str, gate: TcpGate, tmp_path: Path) -> Iterator[LiveServer]:
    url = make_url(database_url).set(host="127.0.0.1", port=gate.port)
    settings = make_settings(tmp_path / "home", url.render_as_string(hide_password=False))
    with live_server(settings, FakeRuntime(), allowed_5xx=frozenset({503})) as server:
        yield server


def assert_unavailable(r: httpx.Response) -> None:
    assert r.status_code == 503, r.text
    assert r.json()["error"]["code"] == "DATABASE_UNAVAILABLE", r.text
    assert r.headers["Retry-After"].isdigit(), r.headers


def test_requests_while_the_database_is_away(gated_srv: LiveServer, gate: TcpGate) -> None:
    key = {"Idempotency-Key": "outage-1"}
    with gated_srv.client() as c:
        first = c.post("/v1/clusters", json={**CLUSTER, "name": "before"})
        assert first.status_code == 201, first.text
        cid = first.json()["data"]["id"]

        gate.cut()
        # Routed (REST create and read), the cluster read fast path (ahead of routing).
        assert_unavailable(c.post("/v1/clusters", json=CLUSTER, headers=key))
        assert_unavailable(c.get(f"/v1/clusters/{cid}"))
        assert_unavailable(c.get("/v1/clusters"))
        gql = c.post("/graphql", json=GRAPHQL_LIST)
        assert gql.json()["errors"][0]["extensions"]["code"] == "DATABASE_UNAVAILABLE", gql.text
        scope = {"project_id": "1", "location": "local"}
        training = c.get("/distributed_jobs_v2/cluster/", params=scope)
        assert training.status_code == 503, training.text
        assert training.json()["errors"]["code"] == "DATABASE_UNAVAILABLE", training.text
        # Liveness needs no database.
        assert c.get("/healthz").status_code == 200

        gate.restore()
        deadline = time.monotonic() + BACK_WITHIN_S
        while (r := c.get("/v1/clusters")).status_code != 200:
            assert_unavailable(r)
            assert time.monotonic() < deadline, "the server does not answer again"
            time.sleep(0.2)
        made = c.post("/v1/clusters", json=CLUSTER, headers=key)
        assert made.status_code == 201, made.text
        again = c.post("/v1/clusters", json=CLUSTER, headers=key)
        assert again.json()["data"]["id"] == made.json()["data"]["id"]
        names = sorted(x["name"] for x in c.get("/v1/clusters").json()["data"]["clusters"])
        assert names == ["before", "outage"]
