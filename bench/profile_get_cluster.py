"""Diagnostic companion of bench_get_cluster.py: where one GET /v1/clusters/{id} spends
its time, measured in-process and single-threaded (no HTTP, no concurrency), one
component at a time, on the real app (build_server + FakeRuntime, SQLite in a temp home).

    .venv/bin/python bench/profile_get_cluster.py [--iterations 2000]

Each row is the mean microseconds per call of that step alone; "full handler" is the
sync route body as FastAPI runs it in the threadpool (auth dependency + _detail +
view + JSONResponse), and "ASGI in-process" is the whole app (middleware, the fast path
of api/fast/fastpath.py, the read lane hop) without a socket: as served, with every request
reading (the view cache off), and with every request answered from the view cache.
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable, MutableMapping
from pathlib import Path
from typing import Any

from sqlalchemy import select, text

from gpuyard.api.app import build_server
from gpuyard.api.http.envelope import ok
from gpuyard.api.rest import clusters as api_clusters
from gpuyard.api.rest.schemas import cluster_json as views
from gpuyard.services.catalog.gpu_type_rows import to_info
from gpuyard.services.clusters import use_cases as uc
from gpuyard.services.clusters import views as cluster_views
from gpuyard.services.clusters.requests import CreateCluster
from gpuyard.services.tenancy.auth import hash_key, resolve_key
from gpuyard.settings import Settings
from gpuyard.store.schema import GpuType, Host, PortAllocation
from gpuyard.testing.fake_runtime import FakeRuntime


def timeit(fn: Callable[[], Any], n: int) -> float:
    for _ in range(min(200, n)):
        fn()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=2000)
    n = ap.parse_args().iterations
    home = Path(tempfile.mkdtemp(prefix="gy-prof-"))
    # Limits on (the middleware's cost is in the figures) but never reached by the loop.
    settings = Settings(home=home, port=0, local_gpus="NVIDIA RTX A6000:8", local_vcpus=64,
                        local_memory_gb=512, local_disk_gb=2000, rate_limit_per_key=1e9,
                        rate_limit_per_source=1e9)  # fmt: skip
    server = build_server(settings, FakeRuntime(), run_reconciler=False)
    ctx, app = server.ctx, server.app
    assert server.admin_key is not None
    key = server.admin_key.key
    state = app.state.gpuyard
    principal = asyncio.run(state.principal(key))
    cluster = uc.create_cluster(
        ctx, principal,
        CreateCluster(name="bench", gpu_type="NVIDIA RTX A6000", gpu_count=1,
                      docker_image="localhost/gpuyard/busybox:latest", volume_gb=1,
                      ports=[{"internal_port": 8888, "external_port": 0, "protocol": "http"}]),
    )  # fmt: skip
    server.reconciler.wait_idle(10)
    cid = cluster.id
    d = api_clusters._detail(state, principal, cid)
    assert d.cluster.status == "running", d.cluster.status
    body = views.cluster_v1(d)

    def with_session(fn: Callable[[Any], Any]) -> Callable[[], Any]:
        def run() -> Any:
            with ctx.read() as s:
                return fn(s)

        return run

    def load(s: Any) -> Any:
        return uc.load_cluster(s, principal, cid)

    c_obj = d.cluster

    def q_host(s: Any) -> Any:
        return list(s.scalars(select(Host).where(Host.id.in_({c_obj.host_id}))))

    def q_gpu(s: Any) -> Any:
        return [
            to_info(g) for g in s.scalars(select(GpuType).where(GpuType.id.in_({c_obj.gpu_type})))
        ]

    def q_ports(s: Any) -> Any:
        return list(s.scalars(select(PortAllocation).where(PortAllocation.cluster_id.in_([cid]))))

    def details_only(s: Any) -> Any:
        return cluster_views.details(ctx, [c_obj], s)[0]

    def handler() -> Any:
        p = state.keys.lookup(hash_key(key)) or principal
        return ok(views.cluster_v1(api_clusters._detail(state, p, cid))).body

    raw = sqlite3.connect(str(home / "gpuyard.db"), check_same_thread=False)

    def raw_sql() -> Any:
        cur = raw.execute(
            "SELECT c.* FROM clusters c JOIN projects p ON p.id = c.project_id "
            "WHERE c.id = ? AND p.account_id = ?", (cid, principal.account_id))  # fmt: skip
        r = cur.fetchall()
        raw.execute("SELECT * FROM hosts WHERE id = ?", (c_obj.host_id,)).fetchall()
        raw.execute("SELECT * FROM gpu_types WHERE id = ?", (c_obj.gpu_type,)).fetchall()
        raw.execute("SELECT * FROM port_allocations WHERE cluster_id = ?", (cid,)).fetchall()
        return r

    # The full ASGI app in-process: a GET through routing, middleware, auth dependency and
    # the threadpool hop, with no socket.
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
        "scheme": "http", "path": f"/v1/clusters/{cid}", "raw_path": f"/v1/clusters/{cid}".encode(),
        "query_string": b"", "root_path": "", "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 1),
        "headers": [(b"host", b"x"), (b"authorization", f"Bearer {key}".encode())],
    }  # fmt: skip

    async def asgi_loop(count: int) -> float:
        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"", "more_body": False}

        statuses: list[int] = []

        async def send(msg: MutableMapping[str, Any]) -> None:
            if msg["type"] == "http.response.start":
                statuses.append(msg["status"])

        for _ in range(min(200, count)):
            await app(dict(scope), receive, send)
        t0 = time.perf_counter()
        for _ in range(count):
            await app(dict(scope), receive, send)
        assert set(statuses) == {200}, set(statuses)
        return (time.perf_counter() - t0) / count * 1e6

    async def threadpool_hop(count: int) -> float:
        from starlette.concurrency import run_in_threadpool

        t0 = time.perf_counter()
        for _ in range(count):
            await run_in_threadpool(lambda: None)
        return (time.perf_counter() - t0) / count * 1e6

    # The view cache (api/fast/view_cache.py) as served, then never answering (every request
    # reads and renders on the read lane), then always answering (a poll's kept answer).
    views_cache = state.views
    whole = asyncio.run(asgi_loop(n))
    default_age = views_cache.max_age_s
    try:
        views_cache.max_age_s = 0.0
        every_read = asyncio.run(asgi_loop(n))
        views_cache.max_age_s = 3600.0
        kept = asyncio.run(asgi_loop(n))
    finally:
        views_cache.max_age_s = default_age
    rows: list[tuple[str, float]] = [
        ("ASGI in-process (whole request, no socket)", whole),
        ("ASGI in-process, every request reads (no view cache)", every_read),
        ("ASGI in-process, kept answer (view cache hit)", kept),
        ("full handler body (auth + _detail + view + render)", timeit(handler, n)),
        (
            "  auth: key cache hit (sha256 + dict)",
            timeit(lambda: state.keys.lookup(hash_key(key)), n),
        ),
        (
            "  auth: resolve_key() DB lookup (cache miss)",
            timeit(with_session(lambda s: resolve_key(s, key)), n),
        ),
        (
            "  _detail (session + load_cluster + details)",
            timeit(lambda: api_clusters._detail(state, principal, cid), n),
        ),
        (
            "    session open/BEGIN/close, no query",
            timeit(with_session(lambda s: s.execute(text("SELECT 1")).all()), n),
        ),
        ("    load_cluster (ORM select+join)", timeit(with_session(load), n)),
        ("    details() (3 ORM queries + rate)", timeit(with_session(details_only), n)),
        ("      hosts query", timeit(with_session(q_host), n)),
        ("      gpu_types query + to_info", timeit(with_session(q_gpu), n)),
        ("      port_allocations query", timeit(with_session(q_ports), n)),
        ("  views.cluster_v1 (dict building)", timeit(lambda: views.cluster_v1(d), n)),
        ("  ok(...) JSONResponse render", timeit(lambda: ok(body).body, n)),
        ("raw sqlite3: the same 4 queries, no ORM", timeit(raw_sql, n)),
        ("threadpool hop (run_in_threadpool no-op)", asyncio.run(threadpool_hop(n))),
    ]
    print(f"per-request cost, in-process, single thread, mean of {n} calls "
          f"(python {sys.version.split()[0]}):")  # fmt: skip
    print(f"{'step':<56} {'us/call':>9}")
    for name, us in rows:
        print(f"{name:<56} {us:>9.0f}")
    print(f"(key hash {hash_key(key)[:8]}..., cluster {cid}, body {len(ok(body).body)} bytes)")
    raw.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
