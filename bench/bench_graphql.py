"""GraphQL list throughput: the seed's ``myself { clusters { ... } }`` query over 200
live clusters vs ``GET /v1/clusters`` (REST v1) returning the same clusters, same server.

- Server: the real app (``build_server``) on the in-memory FakeRuntime with SQLite in
  a temporary home, one uvicorn worker, log level warning; this script launches it in
  a subprocess (``--serve``) with as many declared GPUs as clusters (three types), so
  each cluster (1 GPU, one http port, volume) holds a GPU. All are ``running`` before
  measuring, so every one has runtime stats to fetch.
- GraphQL: ``POST /graphql`` with the seed's body verbatim (id, name, runtime with
  uptime, ports, gpus and container stats). REST: ``GET /v1/clusters?per_page=N``,
  the full v1 objects of the same N clusters (a superset of the GraphQL fields).
- Load: 32 keep-alive connections, closed loop, 2 s warm-up then 8 s measured, per
  target and round; rounds alternate the order. ``wrk`` when installed (POST through a
  Lua script), else bench/_loadgen.py, which only sends GET: the GraphQL query then
  goes as ``GET /graphql?query=...`` (same execution path).

    .venv/bin/python bench/bench_graphql.py [--clusters 200] [--rounds 2] [--duration 8]
        [--client auto]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import cpu_seconds, free_port, stop_process, tail, wait_http_ok
from bench_get_cluster import Result, children_cpu, parse_wrk, run_python_client

GOAL = 0.5
CLUSTERS = 200
GPU_TYPES = ["NVIDIA RTX A6000", "NVIDIA GeForce RTX 4090", "NVIDIA RTX A5000"]
SEED_LIST = (
    '{"query": "query clusters { myself { clusters { id name runtime { uptimeInSeconds ports '
    "{ ip isIpPublic privatePort publicPort type } gpus { id gpuUtilPercent memoryUtilPercent } "
    'container { cpuPercent memoryPercent } } } } }"}'
)


def serve(home: Path, port: int, clusters: int) -> None:
    import uvicorn

    from gpuyard.api.app import build_server
    from gpuyard.settings import Settings
    from gpuyard.testing.fake_runtime import FakeRuntime

    settings = Settings(
        home=home,
        port=port,
        # One GPU per cluster (and then some), a third of each type.
        local_gpus=",".join(f"{t}:{clusters // 3 + 1}" for t in GPU_TYPES),
        local_vcpus=max(128, 2 * clusters),
        local_memory_gb=max(1024, 8 * clusters),
        local_disk_gb=max(4000, 40 * clusters),
        # One key from one address, far past the default limits: the limiter stays on
        # (its cost is in the figures) with limits it never reaches.
        rate_limit_per_key=1e9,
        rate_limit_per_source=1e9,
    )
    app = build_server(settings, FakeRuntime()).app
    uvicorn.run(app, host="127.0.0.1", port=port, workers=1, log_level="warning")


def run_wrk(
    url: str, key: str, conns: int, seconds: float, body: str | None, work: Path
) -> dict[str, float]:
    cmd = ["wrk", "-t1", f"-c{conns}", f"-d{seconds:g}s", "--latency", "--timeout", "10s",
           "-H", f"Authorization: Bearer {key}"]  # fmt: skip
    if body is not None:
        script = work / "post.lua"
        script.write_text(
            'wrk.method = "POST"\n'
            'wrk.headers["Content-Type"] = "application/json"\n'
            f"wrk.body = {json.dumps(body)}\n"
        )
        cmd += ["-s", str(script)]
    out = subprocess.run([*cmd, url], capture_output=True, text=True, check=True).stdout
    return parse_wrk(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--clusters", type=int, default=CLUSTERS)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--connections", type=int, default=32)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--duration", type=float, default=8.0)
    ap.add_argument("--client", choices=["auto", "wrk", "python"], default="auto")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--home", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve(args.home, args.port, args.clusters)
        return 0
    client = args.client
    n = args.clusters
    if client == "auto":
        client = "wrk" if shutil.which("wrk") else "python"

    work = Path(tempfile.mkdtemp(prefix="gy-bench-gql-"))
    proc: subprocess.Popen[bytes] | None = None
    try:
        home, port = work / "home", free_port()
        log_path = work / "gpuyard.log"
        with log_path.open("ab") as log:
            proc = subprocess.Popen(
                [sys.executable, __file__, "--serve", "--home", str(home), "--port", str(port),
                 "--clusters", str(n)],
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        base = f"http://127.0.0.1:{port}"
        wait_http_ok(base + "/healthz", proc, log_path)
        key = json.loads((home / "credentials").read_text())["api_key"]
        with httpx.Client(
            base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=30
        ) as c:
            for i in range(n):
                c.post("/v1/clusters", json={
                    "name": f"bench-{i}", "gpu_type": GPU_TYPES[i % 3], "gpu_count": 1,
                    "docker_image": "localhost/gpuyard/busybox:latest", "volume_gb": 1,
                    "ports": [{"internal_port": 8888, "external_port": 0, "protocol": "http"}],
                }).raise_for_status()  # fmt: skip
            deadline = time.monotonic() + 60 + n / 2
            while True:
                rest = c.get(f"/v1/clusters?per_page={n}")
                rest.raise_for_status()
                listed = rest.json()["data"]["clusters"]
                if len(listed) == n and all(x["status"] == "running" for x in listed):
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError("clusters did not reach running")
                time.sleep(0.2)
            gql = c.post(
                "/graphql", content=SEED_LIST, headers={"Content-Type": "application/json"}
            )
            gql.raise_for_status()
            data = gql.json()
            assert "errors" not in data, data
            got = data["data"]["myself"]["clusters"]
            assert {x["id"] for x in got} == {x["id"] for x in listed}, "not the same clusters"
            assert all(x["runtime"]["container"] for x in got), "stats missing"
        query = json.loads(SEED_LIST)["query"]
        targets = {
            "graphql": (f"{base}/graphql", SEED_LIST)
            if client == "wrk"
            else (f"{base}/graphql?query={quote(query)}", None),
            "rest": (f"{base}/v1/clusters?per_page={n}", None),
        }
        print(
            f"{n} clusters: seed 001 myself{{clusters}} (GraphQL, {len(gql.content)} B) vs "
            f"GET /v1/clusters ({len(rest.content)} B); {args.connections} connections, "
            f"warm-up {args.warmup:g} s, measured {args.duration:g} s, {args.rounds} round(s), "
            f"client={client}, cpus={os.cpu_count()}"
        )
        results: list[Result] = []
        for rnd in range(args.rounds):
            order = ["graphql", "rest"] if rnd % 2 == 0 else ["rest", "graphql"]
            for name in order:
                url, body = targets[name]
                if client == "wrk":
                    run_wrk(url, key, args.connections, args.warmup, body, work)
                    s0, c0, t0 = cpu_seconds(proc.pid), children_cpu(), time.perf_counter()
                    d = run_wrk(url, key, args.connections, args.duration, body, work)
                else:
                    s0, c0, t0 = cpu_seconds(proc.pid), children_cpu(), time.perf_counter()
                    d = run_python_client(url, key, args.connections, args.warmup, args.duration)
                wall = time.perf_counter() - t0
                res = Result(name, rnd + 1, d["rps"], d["p50_ms"], d["p99_ms"], int(d["requests"]),
                             int(d["errors"]), (cpu_seconds(proc.pid) - s0) / wall * 100,
                             (children_cpu() - c0) / wall * 100)  # fmt: skip
                results.append(res)
                if res.errors:
                    raise RuntimeError(f"{name}: {res.errors} errors (non-2xx or socket)")
        print()
        print(f"{'target':<8} {'round':>5} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} "
              f"{'requests':>9} {'srv CPU%':>8} {'cli CPU%':>8}")  # fmt: skip
        for r in results:
            print(f"{r.target:<8} {r.round:>5} {r.rps:>8.0f} {r.p50_ms:>8.2f} {r.p99_ms:>8.2f} "
                  f"{r.requests:>9} {r.server_cpu:>8.0f} {r.client_cpu:>8.0f}")  # fmt: skip
        mean = {
            n: sum(r.rps for r in results if r.target == n) / args.rounds
            for n in ("graphql", "rest")
        }
        ratio = mean["graphql"] / mean["rest"]
        print()
        print(f"mean req/s: graphql {mean['graphql']:.0f}, rest {mean['rest']:.0f}")
        verdict = "MEETS" if ratio >= GOAL else "MISSES"
        print(f"RATIO graphql/rest req/s = {ratio:.2f}x (goal >= {GOAL}x: {verdict})")
        return 0
    except Exception:
        print(f"--- gpuyard log ---\n{tail(work / 'gpuyard.log')}", file=sys.stderr)
        raise
    finally:
        stop_process(proc)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
