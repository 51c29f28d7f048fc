"""GraphQL lists over real HTTP: batched loaders (a list costs the same SQL for 5 and
40 clusters; ``cluster`` fields of one document are read in one batch) and the shared
runtime-stats cache (one engine call per container per ttl, however many requests)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, event

from gpuyard.core.tls_trust import trusted_tls
from gpuyard.runtimes.base import ContainerStats, StatsConsumer
from gpuyard.services.tenancy.auth import Scope, create_account, issue_key
from gpuyard.testing.fake_runtime import FakeRuntime
from tests.helpers import LiveServer, live_server, make_settings

LIST = """
{ myself { clusters {
    id name imageName env costPerHr desiredStatus status actions ports podType
    machine { id name gpuDisplayName gpuTypeId location gpuSource gpuAvailable podHostId }
    networkVolume { id name }
    runtime {
      uptimeInSeconds
      ports { ip isIpPublic privatePort publicPort type proxyUrl }
      gpus { id gpuUtilPercent memoryUtilPercent }
      container { cpuPercent memoryPercent }
    }
} currentSpendPerHr } }
"""
SEED_LIST = (
    "query clusters { myself { clusters { id name runtime { uptimeInSeconds ports { ip "
    "isIpPublic privatePort publicPort type } gpus { id gpuUtilPercent memoryUtilPercent } "
    "container { cpuPercent memoryPercent } } } } }"
)
# Threads that run a GraphQL request's work: the request's worker and the stats
# cache's; the reconciler and other background threads are not the request's.
REQUEST_THREADS = ("AnyIO worker thread", "gql-stats")


class ViewStatsRuntime(FakeRuntime):
    """The fake engine, counting the stats calls made for views (not the idle
    checks of auto-termination) per cluster."""

    def __init__(self) -> None:
        super().__init__()
        self.view_stats: dict[str, int] = {}
        self._count_lock = threading.Lock()

    def stats(self, cluster_id: str, consumer: StatsConsumer = "view") -> ContainerStats | None:
        if consumer == "view":
            with self._count_lock:
                self.view_stats[cluster_id] = self.view_stats.get(cluster_id, 0) + 1
        return super().stats(cluster_id, consumer)


@contextmanager
def counting_statements(srv: LiveServer) -> Iterator[list[str]]:
    """The SQL statements the app's engine runs on request threads meanwhile."""
    engine = srv.server.app.state.gpuyard.ctx.sessions.kw["bind"]
    assert isinstance(engine, Engine)
    seen: list[str] = []

    def before(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if threading.current_thread().name.startswith(REQUEST_THREADS):
            seen.append(statement)

    event.listen(engine, "before_cursor_execute", before)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", before)


def create_clusters(srv: LiveServer, n: int, key: str | None = None) -> list[str]:
    """``n`` running clusters (1 GPU, an http port, a volume), their ids."""
    ids = []
    with srv.client(key) as c:
        for i in range(n):
            r = c.post(
                "/v1/clusters",
                json={
                    "name": f"gql-{i}",
                    "gpu_type": "NVIDIA RTX A6000",
                    "gpu_count": 1,
                    "docker_image": "localhost/gpuyard/busybox:latest",
                    "volume_gb": 1,
                    "ports": [{"internal_port": 8888, "external_port": 0, "protocol": "http"}],
                    "auto_terminate": {"enabled": True, "max_runtime_hours": 10},
                },
            )
            assert r.status_code == 201, r.text
            ids.append(r.json()["data"]["id"])
    assert srv.server.reconciler.wait_idle(60)
    return ids


def ok(body: dict[str, Any]) -> dict[str, Any]:
    assert "errors" not in body, body
    data: dict[str, Any] = body["data"]
    return data


def keep_no_answers(srv: LiveServer) -> None:
    """Every request runs its query: what these tests count is a query's own reads
    and engine calls (kept answers have tests of their own, test_graphql_kept.py)."""
    srv.server.app.state.gpuyard.queries.max_age_s = 0.0


@pytest.fixture
def many(tmp_path: Path, database_url: str) -> Iterator[tuple[LiveServer, ViewStatsRuntime]]:
    """A server with room for 40 one-GPU clusters, on each database backend."""
    runtime = ViewStatsRuntime()
    settings = make_settings(
        tmp_path / "home", database_url, local_gpus="NVIDIA RTX A6000:40", local_vcpus=128
    )
    with live_server(settings, runtime) as srv:
        keep_no_answers(srv)
        yield srv, runtime


def fewest_statements(
    srv: LiveServer, document: str, tries: int = 3
) -> tuple[dict[str, Any], list[str]]:
    """The data and statements of a request of ``document``, its caches warm (the key,
    references): the fewest of ``tries`` requests. A cache that expired between two
    requests (the key's lasts 5 s; on a loaded machine one request of 40 clusters can
    take that long) only adds statements; reads that grow with the rows are in every
    request."""
    ok(srv.graphql(document))
    counted = []
    for _ in range(tries):
        with counting_statements(srv) as seen:
            data = ok(srv.graphql(document))
        counted.append((data, seen))
    return min(counted, key=lambda answer: len(answer[1]))


def listed_statements(srv: LiveServer) -> list[str]:
    """The fewest statements of a list request (:func:`fewest_statements`)."""
    data, seen = fewest_statements(srv, LIST)
    assert all(p["runtime"]["container"] is not None for p in data["myself"]["clusters"])
    return seen


def test_a_list_costs_the_same_statements_for_5_and_40_clusters(
    many: tuple[LiveServer, ViewStatsRuntime],
) -> None:
    srv, _ = many
    create_clusters(srv, 5)
    five = listed_statements(srv)
    create_clusters(srv, 35)
    forty = listed_statements(srv)
    listed = ok(srv.graphql(LIST))["myself"]["clusters"]
    assert len(listed) == 40
    assert all(p["machine"]["gpuDisplayName"] == "RTX A6000" for p in listed)
    assert all(p["costPerHr"] > 0 and p["runtime"]["ports"] for p in listed)
    # Something was read (the count is the request's), and no more for 8x the rows.
    assert five, "no statement seen on the request's threads"
    assert len(forty) == len(five), "\n".join(forty)


def test_cluster_fields_of_one_document_are_read_in_one_batch(
    many: tuple[LiveServer, ViewStatsRuntime],
) -> None:
    srv, _ = many
    ids = create_clusters(srv, 6)

    def by_id(chosen: list[str]) -> tuple[dict[str, Any], list[str]]:
        doc = " ".join(
            f'c{i}: cluster(input: {{clusterId: "{cid}"}}) {{ id costPerHr runtime {{ '
            f"container {{ cpuPercent }} }} }}"
            for i, cid in enumerate(chosen)
        )
        return fewest_statements(srv, f"{{ {doc} }}")

    two, two_sql = by_id(ids[:2])
    six, six_sql = by_id(ids)
    assert [two[f"c{i}"]["id"] for i in range(2)] == ids[:2]
    assert [six[f"c{i}"]["id"] for i in range(6)] == ids
    assert all(six[f"c{i}"]["runtime"]["container"] for i in range(6))
    assert two_sql and len(six_sql) == len(two_sql), "\n".join(six_sql)


def test_a_batch_shows_only_the_callers_clusters(srv: LiveServer) -> None:
    mine = create_clusters(srv, 1)[0]
    with srv.server.ctx.transaction() as session:
        user, account, _ = create_account(session, email="other@example.com", name="o")
        other_key = issue_key(
            session, user_id=user.id, account_id=account.id, name="o", scope=Scope.WRITE
        ).key
    theirs = create_clusters(srv, 1, other_key)[0]
    body = srv.graphql(
        f'{{ a: cluster(input: {{clusterId: "{mine}"}}) {{ id }} '
        f'b: cluster(input: {{clusterId: "{theirs}"}}) {{ id }} '
        f'c: pod(input: {{podId: "nope"}}) {{ id }} }}'
    )
    assert body["data"]["a"] == {"id": mine}
    assert body["data"]["b"] is None and body["data"]["c"] is None
    errors = {tuple(e["path"]): e["extensions"]["code"] for e in body["errors"]}
    assert errors == {("b",): "CLUSTER_NOT_FOUND", ("c",): "CLUSTER_NOT_FOUND"}


def test_a_listed_cluster_is_not_read_again_by_id(
    many: tuple[LiveServer, ViewStatsRuntime],
) -> None:
    srv, _ = many
    cid = create_clusters(srv, 3)[0]
    alone = (
        f'{{ myself {{ clusters {{ id }} }} a: cluster(input: {{clusterId: "{cid}"}}) {{ id }} }}'
    )
    data, with_by_id = fewest_statements(srv, alone)
    assert data["a"] == {"id": cid}
    _, list_only = fewest_statements(srv, "{ myself { clusters { id } } }")
    assert len(with_by_id) == len(list_only), "\n".join(with_by_id)


@pytest.fixture
def stats_srv(
    tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[tuple[LiveServer, ViewStatsRuntime]]:
    """A server whose GraphQL stats ttl is ``request.param`` seconds (the setting is
    read from the environment when the app is built)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("GPUYARD_GRAPHQL_RUNTIME_STATS_TTL_S", str(request.param))
    runtime = ViewStatsRuntime()
    try:
        with live_server(
            make_settings(tmp_path / "home", local_gpus="NVIDIA RTX A6000:8"), runtime
        ) as srv:
            keep_no_answers(srv)
            yield srv, runtime
    finally:
        mp.undo()


@pytest.mark.parametrize("stats_srv", [60], indirect=True)
def test_polling_clients_share_one_engine_call_per_container(
    stats_srv: tuple[LiveServer, ViewStatsRuntime],
) -> None:
    srv, runtime = stats_srv
    ids = create_clusters(srv, 4)
    runtime.view_stats.clear()
    errors: list[BaseException] = []

    def poll() -> None:
        try:
            for _ in range(3):
                r = httpx.post(
                    f"{srv.url}/graphql",
                    json={"query": SEED_LIST},
                    headers={"Authorization": f"Bearer {srv.key}"},
                    timeout=30,
                    verify=trusted_tls(),
                )
                pods = ok(r.json())["myself"]["clusters"]
                assert {p["id"] for p in pods} == set(ids)
                assert all(p["runtime"]["container"]["cpuPercent"] == 1.0 for p in pods)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    clients = [threading.Thread(target=poll) for _ in range(6)]
    for t in clients:
        t.start()
    for t in clients:
        t.join(60)
    assert not errors, errors
    # 18 lists of 4 running clusters: one engine call per container.
    assert runtime.view_stats == dict.fromkeys(ids, 1)


@pytest.mark.parametrize("stats_srv", [0], indirect=True)
def test_stats_older_than_the_ttl_are_read_again(
    stats_srv: tuple[LiveServer, ViewStatsRuntime],
) -> None:
    srv, runtime = stats_srv
    ids = create_clusters(srv, 2)
    runtime.view_stats.clear()
    for _ in range(3):
        ok(srv.graphql(SEED_LIST))
    assert runtime.view_stats == dict.fromkeys(ids, 3)


def test_an_engine_failure_nulls_only_that_container(
    srv: LiveServer, fake_runtime: FakeRuntime
) -> None:
    create_clusters(srv, 3)
    fake_runtime.fail_next["stats"] = "engine hiccup"
    pods = ok(srv.graphql(SEED_LIST))["myself"]["clusters"]
    containers = [p["runtime"]["container"] for p in pods]
    assert containers.count(None) == 1
    assert all(c == {"cpuPercent": 1.0, "memoryPercent": 2.0} for c in containers if c)
