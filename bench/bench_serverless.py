"""Serverless endpoints: RunPod's job API through gpuyard vs the same handler called
directly, on the serverless test image (``gpuyard dev-image --serverless``), in one run.

Set-up: a private ``podman system service`` on a temp socket (PodmanService), the
serverless image (build_serverless_image: Python plus the unmodified runpod-python 1.12,
``HANDLER=echo``), and the real server as a subprocess (``python -m gpuyard serve``,
GPUYARD_HOME temp, GPUYARD_ENGINE_URL = that socket, 8 GPUs declared).

(a) Round trip, one client, interleaved, the order flipped every request:
    ``POST /runpod/v2/{endpoint}/runsync {"input": ...}`` of the echo handler through an
    endpoint with 4 warm workers vs ``POST /`` straight to the same handler in one of
    those worker containers (its DIRECT_HTTP_PORT, at the container's address).
    Reported: p50 and p99 of each, and gpuyard's added time (goal: p50 <= 10 ms added),
    split by the job's own ``delayTime`` (queued until a worker took it: mostly the
    worker's own pause, below) and ``executionTime`` (taken until its result).
(b) Throughput: ``--clients`` threads send echo jobs for ``--seconds`` through runsync
    (4 warm workers, one job at a time each) vs the same threads calling the 4 worker
    containers' handlers directly, round robin (goal >= 0.5x). The unmodified runpod
    worker (1.12, concurrency 1) sleeps 1 s in its take loop once its concurrency is
    full (``JobScaler.get_jobs``), so it takes at most about one job a second: 4 warm
    workers bound this side near 4 jobs/s, whatever the server does.
(c) Cold start: an endpoint with workers_min 0 and no worker running, one runsync until
    its result, vs ``podman run -d -p ... IMAGE`` until the handler answers its first
    request (goal <= 1.2x); and the same with ``flashboot`` (the scaled-down worker's
    container kept), against gpuyard's cold start (goal <= 0.3x). Between runs the
    endpoint is let scale back to zero (idle_timeout_s 1, not timed).

``--baseline-only`` runs the bare parts alone (podman run until the handler answers, the
direct call's p50/p99, the direct jobs/s through 4 containers), with no server: useful
before the endpoint API exists, and to see the machine's own numbers.
``--server-env KEY=VALUE`` (repeatable) adds settings to the server's environment. By
default workers reach the loopback-only API on a worker listener of a free port
(``GPUYARD_SERVERLESS_WORKER_PORT``), and container disk sizes need not be enforced
(``GPUYARD_ALLOW_UNENFORCED_DISK``: engine storage on ext4 cannot).

    .venv/bin/python bench/bench_serverless.py [--baseline-only] [--requests 300]
        [--seconds 8] [--clients 8] [--cold-runs 3] [--server-env KEY=VALUE]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    free_port,
    installation_label,
    median,
    percentile,
    start_server,
    stop_process,
    tail,
)

from gpuyard.devtools.serverless_image import (
    DIRECT_HTTP_PORT,
    SERVERLESS_IMAGE,
    build_serverless_image,
)
from gpuyard.runtimes.engines.url import PodmanService

GOAL_ADDED_P50_MS = 10.0
GOAL_THROUGHPUT = 0.5
GOAL_COLD = 1.2
GOAL_FLASHBOOT = 0.3
WORKERS = 4
PREFIX = "gybench-sls"
POLL_S = 0.01
JOB = {"prompt": "hello", "n": 1}


class Podman:
    """The podman CLI in remote mode against the bench's own service."""

    def __init__(self, url: str) -> None:
        self.url = url

    def __call__(self, *args: str, check: bool = True) -> str:
        p = subprocess.run(["podman", "--url", self.url, *args], capture_output=True, text=True)
        if check and p.returncode != 0:
            raise RuntimeError(f"podman {' '.join(args)} failed: {p.stderr.strip()[-500:]}")
        return p.stdout.strip()

    def address(self, container: str) -> str:
        """The container's address on its network (the host reaches it directly)."""
        fmt = "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}"
        ips = self("inspect", "--format", fmt, container).split()
        if not ips:
            raise RuntimeError(f"container {container} has no address")
        return ips[0]


def wait_answers(url: str, timeout_s: float = 60) -> None:
    """Until ``POST url {"input": JOB}`` answers the echo, polling every 10 ms."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            r = httpx.post(url, json={"input": JOB}, timeout=2)
            if r.status_code == 200 and r.json() == JOB:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} did not answer within {timeout_s:.0f} s")
        time.sleep(POLL_S)


# The bare parts: the image run by podman, its handler called over plain HTTP.


def bare_cold_start(podman: Podman, i: int) -> float:
    """``podman run -d`` of the image with its handler on a published port, until the
    handler answers: seconds."""
    port = free_port()
    name = f"{PREFIX}-cold-{i}"
    t0 = time.perf_counter()
    podman("run", "-d", "--name", name, "-e", f"DIRECT_HTTP_PORT={DIRECT_HTTP_PORT}",
           "-p", f"127.0.0.1:{port}:{DIRECT_HTTP_PORT}", SERVERLESS_IMAGE)  # fmt: skip
    try:
        wait_answers(f"http://127.0.0.1:{port}/")
        return time.perf_counter() - t0
    finally:
        podman("rm", "-f", "-t", "0", name, check=False)


def direct_latencies(url: str, n: int) -> list[float]:
    with httpx.Client(timeout=10) as c:
        c.post(url, json={"input": JOB})  # the connection, unmeasured
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            r = c.post(url, json={"input": JOB})
            out.append(time.perf_counter() - t0)
            assert r.status_code == 200 and r.json() == JOB, r.text
        return out


def throughput(
    call: Callable[[httpx.Client, int], None],
    clients: int,
    seconds: float,
    base_url: str = "",
) -> float:
    """Jobs per second that ``clients`` threads complete in ``seconds``, each calling
    ``call(its own client, its index)`` in a loop."""
    done = [0] * clients
    errors: list[BaseException] = []
    stop_at = time.monotonic() + seconds

    def loop(k: int) -> None:
        try:
            with httpx.Client(base_url=base_url, timeout=180) as c:
                while time.monotonic() < stop_at:
                    call(c, k)
                    done[k] += 1
        except BaseException as e:  # reported below, not lost in the thread
            errors.append(e)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=loop, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    if errors:
        raise RuntimeError(f"{len(errors)} client(s) failed: {errors[0]!r}")
    return sum(done) / elapsed


def direct_call(urls: list[str]) -> Callable[[httpx.Client, int], None]:
    def call(c: httpx.Client, k: int) -> None:
        r = c.post(urls[k % len(urls)], json={"input": JOB})
        if r.status_code != 200:
            raise RuntimeError(f"direct call: {r.status_code} {r.text[:200]}")

    return call


# The gpuyard parts: an endpoint through the public APIs.


class Gpuyard:
    def __init__(self, base: str, key: str) -> None:
        self.c = httpx.Client(
            base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=180
        )
        self.base = base
        self.key = key

    def gpu_type_id(self) -> str:
        r = self.c.get("/v1/gpu-types")
        r.raise_for_status()
        types = [t for t in r.json()["data"]["gpu_types"] if t["available_gpus"] > 0]
        if not types:
            raise RuntimeError("no GPU type with free GPUs in the catalog")
        gpu_id: str = types[0]["id"]
        return gpu_id

    def create_endpoint(
        self, name: str, workers_min: int, workers_max: int, flashboot: bool
    ) -> str:
        body = {
            "name": name,
            "image": SERVERLESS_IMAGE,
            "gpu_type_ids": [self.gpu_type_id()],
            "gpu_count": 1,
            "workers_min": workers_min,
            "workers_max": workers_max,
            "idle_timeout_s": 1,
            "scaler_type": "REQUEST_COUNT",
            "scaler_value": 1,
            "flashboot": flashboot,
            "env": {"HANDLER": "echo", "DIRECT_HTTP_PORT": str(DIRECT_HTTP_PORT)},
        }
        r = self.c.post("/v1/endpoints", json=body)
        if r.status_code not in (200, 201):
            raise RuntimeError(f"POST /v1/endpoints: {r.status_code} {r.text[:500]}")
        endpoint_id: str = r.json()["data"]["id"]
        return endpoint_id

    def delete_endpoint(self, endpoint_id: str) -> None:
        self.c.delete(f"/v1/endpoints/{endpoint_id}")

    def health(self, endpoint_id: str) -> dict[str, Any]:
        r = self.c.get(f"/runpod/v2/{endpoint_id}/health")
        r.raise_for_status()
        data: dict[str, Any] = r.json()
        return data

    def wait_workers(self, endpoint_id: str, want: Callable[[int], bool], timeout_s: float) -> None:
        """Until ``want(number of workers)`` holds, counting every worker the endpoint
        has (starting ones too, so that "zero" means none at all); a capacity problem
        on the endpoint (no worker can start) ends the wait at once."""
        deadline = time.monotonic() + timeout_s
        while True:
            r = self.c.get(f"/v1/endpoints/{endpoint_id}")
            r.raise_for_status()
            data = r.json()["data"]
            workers: dict[str, int] = data["workers"]
            if want(sum(workers.values())):
                return
            if data.get("capacity_problem"):
                raise RuntimeError(f"endpoint {endpoint_id}: {data['capacity_problem']}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"endpoint {endpoint_id}: workers {workers} after {timeout_s} s")
            time.sleep(0.1)

    def wait_ready(self, endpoint_id: str, count: int, timeout_s: float) -> None:
        """Until ``count`` workers are ready and idle (``health``)."""
        deadline = time.monotonic() + timeout_s
        while True:
            workers = self.health(endpoint_id)["workers"]
            if int(workers.get("idle", 0)) >= count:
                return
            r = self.c.get(f"/v1/endpoints/{endpoint_id}")
            r.raise_for_status()
            if problem := r.json()["data"].get("capacity_problem"):
                raise RuntimeError(f"endpoint {endpoint_id}: {problem}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"endpoint {endpoint_id}: workers {workers} after {timeout_s} s")
            time.sleep(0.1)

    def runsync(self, c: httpx.Client, endpoint_id: str) -> dict[str, Any]:
        """One echo job, until its result (polling its status if runsync's wait ends
        first)."""
        r = c.post(
            f"/runpod/v2/{endpoint_id}/runsync",
            json={"input": JOB},
            headers={"Authorization": f"Bearer {self.key}"},
        )
        if r.status_code != 200:
            raise RuntimeError(f"runsync: {r.status_code} {r.text[:300]}")
        job: dict[str, Any] = r.json()
        while job["status"] in ("IN_QUEUE", "IN_PROGRESS"):
            time.sleep(POLL_S)
            s = c.get(f"/runpod/v2/{endpoint_id}/status/{job['id']}",
                      headers={"Authorization": f"Bearer {self.key}"})  # fmt: skip
            s.raise_for_status()
            job = s.json()
        if job["status"] != "COMPLETED" or job.get("output") != JOB:
            raise RuntimeError(f"job {job.get('id')}: {json.dumps(job)[:300]}")
        return job


def worker_addresses(podman: Podman, home: Path) -> list[str]:
    mine = installation_label(home)
    if mine is None:
        raise RuntimeError("the server has no installation id yet")
    ids = podman("ps", "--filter", f"label={mine}", "--format", "{{.ID}}").split()
    return [f"http://{podman.address(i)}:{DIRECT_HTTP_PORT}/" for i in ids]


def stats(label: str, seconds: list[float]) -> str:
    ms = [s * 1000 for s in seconds]
    return (f"{label:<52} {median(ms):>9.2f} {percentile(ms, 99):>9.2f} "
            f"{min(ms):>8.2f} {max(ms):>8.2f}")  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--baseline-only", action="store_true")
    ap.add_argument("--requests", type=int, default=300, help="round trips for (a), each side")
    ap.add_argument("--seconds", type=float, default=8.0, help="duration of (b), each side")
    ap.add_argument("--clients", type=int, default=8, help="client threads for (b)")
    ap.add_argument("--cold-runs", type=int, default=3, help="cold starts for (c), each kind")
    ap.add_argument("--server-env", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args()
    if shutil.which("podman") is None:
        print("podman is not installed (apt-get install podman)", file=sys.stderr)
        return 2

    work = Path(tempfile.mkdtemp(prefix="gy-bench-sls-"))
    service = PodmanService(work / "podman.sock")
    server: subprocess.Popen[bytes] | None = None
    podman: Podman | None = None
    home = work / "home"
    log = work / "server.log"
    bare_names: list[str] = []
    endpoints: list[str] = []
    gy: Gpuyard | None = None
    try:
        url = service.start()
        t0 = time.perf_counter()
        build_serverless_image("podman")
        build_s = time.perf_counter() - t0
        podman = Podman(url)
        size = podman("image", "inspect", "--format", "{{.Size}}", SERVERLESS_IMAGE)
        print(f"image {SERVERLESS_IMAGE}: {int(size) / 1e6:.0f} MB, build (or reuse) {build_s:.1f} s",
              flush=True)  # fmt: skip

        # The bare parts, always.
        cold_bare = []
        bare_cold_start(podman, -1)  # warm-up: image layers in the page cache
        for i in range(args.cold_runs):
            cold_bare.append(bare_cold_start(podman, i))
            print(f"  bare cold start {i + 1}: {cold_bare[-1] * 1000:.0f} ms", flush=True)
        for k in range(WORKERS):
            name = f"{PREFIX}-direct-{k}"
            bare_names.append(name)
            podman("run", "-d", "--name", name, "-e", f"DIRECT_HTTP_PORT={DIRECT_HTTP_PORT}",
                   SERVERLESS_IMAGE)  # fmt: skip
        bare_urls = [f"http://{podman.address(n)}:{DIRECT_HTTP_PORT}/" for n in bare_names]
        for u in bare_urls:
            wait_answers(u)
        bare_lat = direct_latencies(bare_urls[0], args.requests)
        bare_tput = throughput(direct_call(bare_urls), args.clients, args.seconds)
        for name in bare_names:
            podman("rm", "-f", "-t", "0", name, check=False)
        bare_names.clear()

        print()
        print(f"Serverless, image {SERVERLESS_IMAGE}, cpus={os.cpu_count()}")
        print(f"{'ms':<52} {'p50':>9} {'p99':>9} {'min':>8} {'max':>8}")
        print(stats("podman run -d until the handler answers", cold_bare))
        print(stats("direct POST / to the handler (one container)", bare_lat))
        print(f"direct jobs/s, {args.clients} clients over {WORKERS} containers: {bare_tput:.0f}")
        if args.baseline_only:
            print("RATIO baseline only: the gpuyard parts were not run (--baseline-only)")
            return 0

        port = free_port()
        env = {
            **os.environ,
            "GPUYARD_HOME": str(home),
            "GPUYARD_PORT": str(port),
            "GPUYARD_ENGINE_URL": url,
            "GPUYARD_LOCAL_GPUS": "NVIDIA RTX A6000:8",
            "GPUYARD_LOCAL_VCPUS": "64",
            "GPUYARD_LOCAL_MEMORY_GB": "512",
            "GPUYARD_LOCAL_DISK_GB": "2000",
            "GPUYARD_RATE_LIMIT_PER_KEY": "1e9",
            "GPUYARD_RATE_LIMIT_PER_SOURCE": "1e9",
            # The API listens on loopback: workers' containers reach it on a second
            # listener that takes worker keys only (services/serverless/callback.py).
            "GPUYARD_SERVERLESS_WORKER_PORT": str(free_port()),
            # Engine storage that cannot enforce container disk sizes (ext4 without
            # project quotas, as on most development machines) still runs the workers.
            "GPUYARD_ALLOW_UNENFORCED_DISK": "true",
        }
        for item in args.server_env:
            k, _, v = item.partition("=")
            env[k] = v
        server, base, key = start_server(home, port, env, log)
        gy = Gpuyard(base, key)

        # (a) and (b): 4 warm workers.
        warm = gy.create_endpoint(f"{PREFIX}-warm", WORKERS, WORKERS, flashboot=False)
        endpoints.append(warm)
        gy.wait_ready(warm, WORKERS, timeout_s=180)
        with httpx.Client(base_url=base, timeout=180) as c:
            for _ in range(WORKERS * 3):
                gy.runsync(c, warm)  # every worker has taken a job: warm
        urls = worker_addresses(podman, home)
        for u in urls:
            wait_answers(u)
        gy_lat: list[float] = []
        # RunPod's own times of each job: delayTime (queued until a worker took it) and
        # executionTime (taken until its result came back), seconds.
        gy_delay: list[float] = []
        gy_exec: list[float] = []
        direct_lat: list[float] = []
        with httpx.Client(base_url=base, timeout=180) as c, httpx.Client(timeout=10) as d:
            for i in range(args.requests):

                def gy_one() -> None:
                    t = time.perf_counter()
                    job = gy.runsync(c, warm)
                    gy_lat.append(time.perf_counter() - t)
                    gy_delay.append(float(job.get("delayTime", 0)) / 1000)
                    gy_exec.append(float(job.get("executionTime", 0)) / 1000)

                def direct_one() -> None:
                    t = time.perf_counter()
                    r = d.post(urls[i % len(urls)], json={"input": JOB})
                    direct_lat.append(time.perf_counter() - t)
                    assert r.status_code == 200 and r.json() == JOB

                for part in (gy_one, direct_one) if i % 2 == 0 else (direct_one, gy_one):
                    part()

        def gy_call(c: httpx.Client, k: int) -> None:
            gy.runsync(c, warm)

        gy_tput = throughput(gy_call, args.clients, args.seconds, base_url=base)
        direct_tput = throughput(direct_call(urls), args.clients, args.seconds)
        gy.delete_endpoint(warm)

        # (c): from zero workers, without and with flashboot.
        cold: dict[bool, list[float]] = {False: [], True: []}
        for flashboot in (False, True):
            ep = gy.create_endpoint(f"{PREFIX}-cold-{int(flashboot)}", 0, 1, flashboot=flashboot)
            endpoints.append(ep)
            runs = args.cold_runs + (1 if flashboot else 0)  # flashboot's first run creates
            with httpx.Client(base_url=base, timeout=180) as c:
                for i in range(runs):
                    gy.wait_workers(ep, lambda n: n == 0, timeout_s=120)
                    time.sleep(1.0)  # the scaler has seen zero: the next job starts one
                    t = time.perf_counter()
                    gy.runsync(c, ep)
                    dt = time.perf_counter() - t
                    if flashboot and i == 0:
                        continue
                    cold[flashboot].append(dt)
                    print(f"  gpuyard cold start{' (flashboot)' if flashboot else ''} "
                          f"{len(cold[flashboot])}: {dt * 1000:.0f} ms", flush=True)  # fmt: skip
            gy.delete_endpoint(ep)

        print()
        print(f"{'ms':<52} {'p50':>9} {'p99':>9} {'min':>8} {'max':>8}")
        print(stats("gpuyard runsync, echo, 4 warm workers", gy_lat))
        print(stats("  of which delayTime (queued until a worker took it)", gy_delay))
        print(stats("  of which executionTime (taken until its result)", gy_exec))
        rest = [t - d - e for t, d, e in zip(gy_lat, gy_delay, gy_exec, strict=True)]
        print(stats("  the rest (the API, the hand-off, the answer)", rest))
        print(stats("direct POST / to the same workers' handler", direct_lat))
        print(stats("gpuyard cold start: 0 workers -> first result", cold[False]))
        print(stats("gpuyard cold start with flashboot", cold[True]))
        print(stats("podman run -d until the handler answers", cold_bare))
        added50 = (median(gy_lat) - median(direct_lat)) * 1000
        added99 = (percentile(gy_lat, 99) - percentile(direct_lat, 99)) * 1000
        r_tput = gy_tput / direct_tput
        r_cold = median(cold[False]) / median(cold_bare)
        r_flash = median(cold[True]) / median(cold[False])
        print(f"jobs/s, {args.clients} clients: gpuyard {gy_tput:.0f}, direct {direct_tput:.0f} "
              f"(direct with its own containers before: {bare_tput:.0f})")  # fmt: skip
        print()
        print(f"RATIO (a) runsync added p50 {added50:.1f} ms, p99 {added99:.1f} ms "
              f"(goal p50 <= {GOAL_ADDED_P50_MS:.0f} ms: "
              f"{'MEETS' if added50 <= GOAL_ADDED_P50_MS else 'MISSES'})")  # fmt: skip
        print(
            f"RATIO (b) jobs/s gpuyard/direct {r_tput:.2f}x "
            f"(goal >= {GOAL_THROUGHPUT}x: {'MEETS' if r_tput >= GOAL_THROUGHPUT else 'MISSES'})"
        )
        print(
            f"RATIO (c) cold start gpuyard/podman run {r_cold:.2f}x "
            f"(goal <= {GOAL_COLD}x: {'MEETS' if r_cold <= GOAL_COLD else 'MISSES'}); "
            f"flashboot/cold {r_flash:.2f}x "
            f"(goal <= {GOAL_FLASHBOOT}x: {'MEETS' if r_flash <= GOAL_FLASHBOOT else 'MISSES'})"
        )
        return 0
    except Exception:
        if server is not None:
            print("--- server log ---\n" + tail(log), file=sys.stderr)
        raise
    finally:
        if gy is not None:
            for ep in endpoints:
                with contextlib.suppress(httpx.HTTPError):
                    gy.delete_endpoint(ep)
            gy.c.close()
        stop_process(server)
        if podman is not None:
            for name in bare_names:
                podman("rm", "-f", "-t", "0", name, check=False)
            # Anything this run's server left: only objects labelled with its installation.
            mine = installation_label(home)
            if mine:
                podman("rm", "-f", "-v", "--filter", f"label={mine}", check=False)
                podman("volume", "prune", "-f", "--filter", f"label={mine}", check=False)
        service.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
