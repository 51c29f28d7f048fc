"""GET /v1/clusters/{id} throughput and latency: gpuyard vs a bare Starlette endpoint.

Every server runs as a separate subprocess under uvicorn (one worker, log level
warning) on this machine:

- gpuyard: the real app (``build_server``) on the in-memory FakeRuntime with SQLite in a
  temporary home (bench/_gpuyard_fake_server.py); one cluster is created first and left
  to reach ``running``. Authentication, the rate limiter, the cluster read and the v1
  envelope all run per request.
- starlette (the baseline of the goal): a bare Starlette app with one ``async`` route
  returning, through JSONResponse, the exact JSON document gpuyard returned for that
  cluster (bench/_bare_server.py --kind starlette).
- fastapi (reference only): the same route in a minimal FastAPI app.

Load: 32 keep-alive connections, closed loop (one request in flight per connection),
2 s warm-up then 8 s measured, per target and round; each round rotates the target
order. The client is ``wrk`` when installed (``apt-get install -y wrk``), else the
asyncio raw-socket generator in bench/_loadgen.py. Server and client CPU use over the
measured window are printed so a client bottleneck would show.

    .venv/bin/python bench/bench_get_cluster.py [--rounds 2] [--duration 8] [--client auto]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import BENCH_DIR, cpu_seconds, free_port, stop_process, tail, wait_http_ok

# gpuyard's req/s over the bare Starlette endpoint's (issue 16).
GOAL = 0.75
BASELINE = "starlette"
TARGETS = ("gpuyard", "starlette", "fastapi")


@dataclass
class Result:
    target: str
    round: int
    rps: float
    p50_ms: float
    p99_ms: float
    requests: int
    errors: int
    server_cpu: float  # percent of one core over the measured window
    client_cpu: float


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1000.0, "m": 60000.0}


def _ms(text: str) -> float:
    m = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text.strip())
    if not m:
        raise ValueError(f"cannot parse wrk latency {text!r}")
    return float(m.group(1)) * _UNITS[m.group(2)]


def run_wrk(url: str, key: str, conns: int, seconds: float) -> dict[str, float]:
    out = subprocess.run(
        ["wrk", "-t1", f"-c{conns}", f"-d{seconds:g}s", "--latency", "--timeout", "10s",
         "-H", f"Authorization: Bearer {key}", url],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return parse_wrk(out)


def parse_wrk(out: str) -> dict[str, float]:
    """req/s, p50/p99 (ms), request and error counts from wrk's --latency output."""
    pcts = dict(re.findall(r"^\s+(50|99)%\s+(\S+)\s*$", out, re.M))
    if "99" not in pcts:
        raise RuntimeError(f"unexpected wrk output:\n{out}")
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    total = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    errs = re.search(r"Socket errors:.*", out)
    errors = int(non2xx.group(1)) if non2xx else 0
    if errs:
        errors += sum(int(n) for n in re.findall(r"\d+", errs.group(0)))
    return {"rps": rps, "p50_ms": _ms(pcts["50"]), "p99_ms": _ms(pcts["99"]),
            "requests": total, "errors": errors}  # fmt: skip


def run_python_client(
    url: str, key: str, conns: int, warmup: float, seconds: float
) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, str(BENCH_DIR / "_loadgen.py"), "--url", url, "--connections", str(conns),
         "--warmup", str(warmup), "--duration", str(seconds),
         "--header", f"Authorization: Bearer {key}"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    data: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return data


def measure(
    target: str, rnd: int, url: str, key: str, pid: int, client: str, args: argparse.Namespace
) -> Result:
    if client == "wrk":
        run_wrk(url, key, args.connections, args.warmup)  # warm-up, discarded
        s0, c0, t0 = cpu_seconds(pid), children_cpu(), time.perf_counter()
        data = run_wrk(url, key, args.connections, args.duration)
    else:
        # The Python client warms up inside the same process (first --warmup seconds).
        s0, c0, t0 = cpu_seconds(pid), children_cpu(), time.perf_counter()
        data = run_python_client(url, key, args.connections, args.warmup, args.duration)
    wall = time.perf_counter() - t0
    server_cpu = (cpu_seconds(pid) - s0) / wall * 100
    client_cpu = (children_cpu() - c0) / wall * 100
    return Result(target, rnd, data["rps"], data["p50_ms"], data["p99_ms"], int(data["requests"]),
                  int(data["errors"]), server_cpu, client_cpu)  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2, help="rounds; each measures both targets")
    ap.add_argument("--connections", type=int, default=32)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--duration", type=float, default=8.0)
    ap.add_argument("--client", choices=["auto", "wrk", "python"], default="auto")
    args = ap.parse_args()
    client = args.client
    if client == "auto":
        client = "wrk" if shutil.which("wrk") else "python"
    if client == "wrk" and not shutil.which("wrk"):
        print("wrk not found: apt-get install -y wrk, or use --client python", file=sys.stderr)
        return 2

    work = Path(tempfile.mkdtemp(prefix="gy-bench-get-"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        home = work / "home"
        gy_port = free_port()
        gy_log = work / "gpuyard.log"
        with gy_log.open("ab") as log:
            gy = subprocess.Popen(
                [sys.executable, str(BENCH_DIR / "_gpuyard_fake_server.py"), "--home", str(home),
                 "--port", str(gy_port)],
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        procs.append(gy)
        gy_url = f"http://127.0.0.1:{gy_port}"
        wait_http_ok(gy_url + "/healthz", gy, gy_log)
        key = json.loads((home / "credentials").read_text())["api_key"]
        with httpx.Client(
            base_url=gy_url, headers={"Authorization": f"Bearer {key}"}, timeout=30
        ) as c:
            r = c.post(
                "/v1/clusters",
                json={"name": "bench", "gpu_type": "NVIDIA RTX A6000", "gpu_count": 1,
                      "docker_image": "localhost/gpuyard/busybox:latest",
                      "ports": [{"internal_port": 8888, "external_port": 0, "protocol": "http"}],
                      "volume_gb": 1},
            )  # fmt: skip
            r.raise_for_status()
            cid = r.json()["data"]["id"]
            deadline = time.monotonic() + 30
            while True:
                body = c.get(f"/v1/clusters/{cid}")
                body.raise_for_status()
                if body.json()["data"]["status"] == "running":
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"cluster did not reach running: {body.text}")
                time.sleep(0.05)
        body_path = work / "body.json"
        body_path.write_bytes(body.content)

        targets = {"gpuyard": (f"{gy_url}/v1/clusters/{cid}", gy.pid)}
        for kind in ("starlette", "fastapi"):
            bare_port = free_port()
            bare_log = work / f"{kind}.log"
            with bare_log.open("ab") as log:
                bare = subprocess.Popen(
                    [sys.executable, str(BENCH_DIR / "_bare_server.py"), "--body", str(body_path),
                     "--port", str(bare_port), "--kind", kind],
                    stdout=log, stderr=subprocess.STDOUT,
                )  # fmt: skip
            procs.append(bare)
            bare_url = f"http://127.0.0.1:{bare_port}"
            wait_http_ok(bare_url + "/healthz", bare, bare_log)
            check = httpx.get(f"{bare_url}/v1/clusters/{cid}").json()
            assert check == json.loads(body.content), f"{kind} does not return gpuyard's body"
            targets[kind] = (f"{bare_url}/v1/clusters/{cid}", bare.pid)

        print(
            f"GET /v1/clusters/{{id}}: {args.connections} connections, keep-alive, warm-up "
            f"{args.warmup:g} s, measured {args.duration:g} s per run, {args.rounds} round(s), "
            f"client={client}, cpus={os.cpu_count()}, body {len(body.content)} bytes"
        )
        results: list[Result] = []
        for rnd in range(args.rounds):
            shift = rnd % len(TARGETS)
            order = [*TARGETS[shift:], *TARGETS[:shift]]
            for name in order:
                url, pid = targets[name]
                res = measure(name, rnd + 1, url, key, pid, client, args)
                results.append(res)
                if res.errors:
                    raise RuntimeError(f"{name}: {res.errors} errors (non-2xx or socket)")

        print()
        print(f"{'target':<9} {'round':>5} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} "
              f"{'requests':>9} {'srv CPU%':>8} {'cli CPU%':>8}")  # fmt: skip
        for row in results:
            print(f"{row.target:<9} {row.round:>5} {row.rps:>9.0f} {row.p50_ms:>8.2f} "
                  f"{row.p99_ms:>8.2f} {row.requests:>9} {row.server_cpu:>8.0f} "
                  f"{row.client_cpu:>8.0f}")  # fmt: skip
        print()
        summary: dict[str, tuple[float, float, float]] = {}
        for name in TARGETS:
            rs = [row for row in results if row.target == name]
            summary[name] = (
                sum(row.rps for row in rs) / len(rs),
                sum(row.p50_ms for row in rs) / len(rs),
                sum(row.p99_ms for row in rs) / len(rs),
            )
        print(f"{'summary':<9} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8}   (mean over rounds)")
        for name, (rps, p50, p99) in summary.items():
            print(f"{name:<9} {rps:>9.0f} {p50:>8.2f} {p99:>8.2f}")
        ratio = summary["gpuyard"][0] / summary[BASELINE][0]
        p99_ratio = summary["gpuyard"][2] / summary[BASELINE][2]
        fastapi_ratio = summary["gpuyard"][0] / summary["fastapi"][0]
        verdict = "MEETS" if ratio >= GOAL else "MISSES"
        print()
        print(f"(reference) gpuyard/bare FastAPI req/s = {fastapi_ratio:.2f}x")
        print(
            f"RATIO gpuyard/bare Starlette req/s = {ratio:.2f}x (goal >= {GOAL}x: {verdict}); "
            f"p99 gpuyard/bare Starlette = {p99_ratio:.2f}x"
        )
        return 0
    except Exception:
        for name in TARGETS:
            log_path = work / f"{name}.log"
            if log_path.exists():
                print(f"--- {name} log ---\n{tail(log_path)}", file=sys.stderr)
        raise
    finally:
        for p in reversed(procs):
            stop_process(p)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
