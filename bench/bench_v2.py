"""RunPod REST v2 reads vs the same data from gpuyard's REST v1, same server, one run.

- Server: the real app (``build_server``) on the in-memory FakeRuntime with SQLite in
  a temporary home, one uvicorn worker (bench/bench_graphql.py ``serve``), 50 running
  clusters (1 GPU, one http port, a volume each).
- Targets, each with the caller's key as ``Authorization: Bearer``:
  ``GET /runpod/v2/pods/{id}`` vs ``GET /v1/clusters/{id}`` (one cluster, polled), and
  ``GET /runpod/v2/pods`` (all 50 pods) vs ``GET /v1/clusters?per_page=50``.
- Load: 32 keep-alive connections, closed loop, 2 s warm-up then 8 s measured, per
  target and round; rounds alternate the order. ``wrk`` when installed, else
  bench/_loadgen.py.

Prints req/s, p50 and p99 per target and round and ``RATIO v2/v1`` for each pair
(goal >= 0.9x each).

    .venv/bin/python bench/bench_v2.py [--clusters 50] [--rounds 2] [--duration 8]
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

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import cpu_seconds, free_port, stop_process, tail, wait_http_ok
from bench_get_cluster import Result, children_cpu, run_python_client
from bench_graphql import GPU_TYPES, run_wrk, serve

GOAL = 0.9
CLUSTERS = 50
PAIRS = (("v2-get", "v1-get"), ("v2-list", "v1-list"))


def _seed(c: httpx.Client, n: int) -> str:
    """Create ``n`` clusters, wait until all run; the id of the first."""
    for i in range(n):
        c.post("/v1/clusters", json={
            "name": f"bench-{i}", "gpu_type": GPU_TYPES[i % 3], "gpu_count": 1,
            "docker_image": "localhost/gpuyard/busybox:latest", "volume_gb": 1,
            "ports": [{"internal_port": 8888, "external_port": 0, "protocol": "http"}],
        }).raise_for_status()  # fmt: skip
    deadline = time.monotonic() + 60 + n / 2
    while True:
        listed = c.get(f"/v1/clusters?per_page={n}").json()["data"]["clusters"]
        if len(listed) == n and all(x["status"] == "running" for x in listed):
            return str(listed[0]["id"])
        if time.monotonic() > deadline:
            raise RuntimeError("clusters did not reach running")
        time.sleep(0.2)


def _check_same(c: httpx.Client, cluster_id: str, n: int) -> dict[str, int]:
    """Both surfaces answer the same clusters; the size of each answer."""
    sizes: dict[str, int] = {}
    one_v1 = c.get(f"/v1/clusters/{cluster_id}")
    one_v2 = c.get(f"/runpod/v2/pods/{cluster_id}")
    one_v1.raise_for_status()
    one_v2.raise_for_status()
    assert one_v2.json()["id"] == one_v1.json()["data"]["id"] == cluster_id
    all_v1 = c.get(f"/v1/clusters?per_page={n}")
    all_v2 = c.get("/runpod/v2/pods")
    ids_v1 = {x["id"] for x in all_v1.json()["data"]["clusters"]}
    ids_v2 = {x["id"] for x in all_v2.json()["pods"]}
    assert ids_v1 == ids_v2 and len(ids_v2) == n, "not the same clusters"
    for name, r in (("v1-get", one_v1), ("v2-get", one_v2), ("v1-list", all_v1),
                    ("v2-list", all_v2)):  # fmt: skip
        sizes[name] = len(r.content)
    return sizes


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
    if client == "auto":
        client = "wrk" if shutil.which("wrk") else "python"
    n = args.clusters
    work = Path(tempfile.mkdtemp(prefix="gy-bench-v2-"))
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
            cluster_id = _seed(c, n)
            sizes = _check_same(c, cluster_id, n)
        targets = {
            "v2-get": f"{base}/runpod/v2/pods/{cluster_id}",
            "v1-get": f"{base}/v1/clusters/{cluster_id}",
            "v2-list": f"{base}/runpod/v2/pods",
            "v1-list": f"{base}/v1/clusters?per_page={n}",
        }
        print(
            f"{n} running clusters; answer sizes (B): "
            + ", ".join(f"{k} {v}" for k, v in sizes.items())
            + f"; {args.connections} connections, warm-up {args.warmup:g} s, measured "
            f"{args.duration:g} s, {args.rounds} round(s), client={client}, cpus={os.cpu_count()}"
        )
        results: list[Result] = []
        for rnd in range(args.rounds):
            for pair in PAIRS:
                for name in pair if rnd % 2 == 0 else tuple(reversed(pair)):
                    url = targets[name]
                    if client == "wrk":
                        run_wrk(url, key, args.connections, args.warmup, None, work)
                        s0, c0, t0 = cpu_seconds(proc.pid), children_cpu(), time.perf_counter()
                        d = run_wrk(url, key, args.connections, args.duration, None, work)
                    else:
                        s0, c0, t0 = cpu_seconds(proc.pid), children_cpu(), time.perf_counter()
                        d = run_python_client(
                            url, key, args.connections, args.warmup, args.duration
                        )
                    wall = time.perf_counter() - t0
                    res = Result(name, rnd + 1, d["rps"], d["p50_ms"], d["p99_ms"],
                                 int(d["requests"]), int(d["errors"]),
                                 (cpu_seconds(proc.pid) - s0) / wall * 100,
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
        print()
        for v2, v1 in PAIRS:
            mean = {t: sum(r.rps for r in results if r.target == t) / args.rounds for t in (v2, v1)}
            ratio = mean[v2] / mean[v1]
            verdict = "MEETS" if ratio >= GOAL else "MISSES"
            print(f"RATIO {v2}/{v1} req/s = {ratio:.2f}x "
                  f"({mean[v2]:.0f} vs {mean[v1]:.0f}; goal >= {GOAL}x: {verdict})")  # fmt: skip
        return 0
    except Exception:
        print(f"--- gpuyard log ---\n{tail(work / 'gpuyard.log')}", file=sys.stderr)
        raise
    finally:
        stop_process(proc)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
