"""Start latency: gpuyard (create->running, stopped->running) vs bare engine runs of the
same image on the same engine.

Set-up: a private ``podman system service`` on a temp socket (PodmanService), the
offline dev image (build_dev_image), and the real server as a subprocess
(``python -m gpuyard serve``, GPUYARD_HOME temp, GPUYARD_ENGINE_URL = that socket).

Per run (default 20, ``--runs``), gpuyard and bare measurements interleaved, with the
order flipped every run:

- gpuyard create->running: POST /v1/clusters {"wait_for_ready": true} (gpu_count 1,
  the dev image, port 8888, volume_gb 1) until it answers ``running`` (the server waits
  on its own recorded status, as a start with it does). Polling GET every 10 ms instead
  costs the server CPU that the engine's start on the same cores then lacks.
- bare create: ``podman --url unix://SOCK run -d -p 8888 -v NEWVOL:/workspace
  --cpus 2 --memory 4g IMAGE`` until it returns (container running). gpuyard's cluster
  gets the same limits (its defaults: 2 cores, 4 GB); ``-p 8888`` is a random host port
  (podman rejects ``-p 0:8888``).
- gpuyard stopped->running: stop the cluster and wait for ``stopped`` (not timed), then
  POST /v1/clusters/{id}/start {"wait_for_ready": true} until it returns (the server
  waits on its own recorded status).
- bare stopped->running, two baselines: gpuyard's stop removes the container (its disk
  is wiped), so the like-for-like baseline is a fresh ``podman run -d`` on the existing
  volume; ``podman start`` of a stopped (not removed) container is shown as well.

It also prints the server's own recorded start durations (startup_samples table:
start requested -> recorded running, no HTTP polling) for the same runs.

With ``--db postgres`` the server keeps its store in a fresh PostgreSQL database, made
for the run on the server that GPUYARD_TEST_POSTGRES_URL names (else the one
scripts/test-postgres.sh starts) and dropped afterwards.

    .venv/bin/python bench/bench_start_latency.py [--runs 20] [--db sqlite|postgres]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    DEV_IMAGE,
    free_port,
    installation_label,
    median,
    percentile,
    start_server,
    stop_process,
    tail,
)

from gpuyard.runtimes.engines.devimage import build_dev_image
from gpuyard.runtimes.engines.url import PodmanService

GOAL = 1.1
PREFIX = "gybench"


class Bare:
    """The podman CLI in remote mode against the same service gpuyard uses."""

    def __init__(self, url: str) -> None:
        self.url = url

    def run(self, *args: str, check: bool = True) -> float:
        t0 = time.perf_counter()
        p = subprocess.run(["podman", "--url", self.url, *args], capture_output=True, text=True)
        dt = time.perf_counter() - t0
        if check and p.returncode != 0:
            raise RuntimeError(f"podman {' '.join(args)} failed: {p.stderr.strip()[-500:]}")
        return dt

    def run_container(self, name: str, volume: str) -> float:
        return self.run("run", "-d", "--name", name, "-p", "8888", "-v", f"{volume}:/workspace",
                        "--cpus", "2", "--memory", "4g", DEV_IMAGE)  # fmt: skip

    def cleanup(self, name: str, volume: str) -> None:
        self.run("rm", "-f", "-v", name, check=False)
        self.run("volume", "rm", "-f", volume, check=False)


def wait_status(
    c: httpx.Client, cid: str, want: set[str], poll_s: float, timeout_s: float = 120
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        r = c.get(f"/v1/clusters/{cid}")
        r.raise_for_status()
        data: dict[str, Any] = r.json()["data"]
        if data["status"] in want:
            return data
        if data["status"] == "error":
            raise RuntimeError(f"cluster {cid} failed: {data.get('error_message')}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"cluster {cid} stuck in {data['status']}")
        time.sleep(poll_s)


def gy_create(c: httpx.Client, i: int) -> tuple[str, float]:
    t0 = time.perf_counter()
    r = c.post(
        "/v1/clusters",
        json={"name": f"{PREFIX}-{i}", "gpu_type": "NVIDIA RTX A6000", "gpu_count": 1,
              "docker_image": DEV_IMAGE, "volume_gb": 1, "wait_for_ready": True,
              "timeout_minutes": 2,
              "ports": [{"internal_port": 8888, "external_port": 0, "protocol": "http"}]},
    )  # fmt: skip
    dt = time.perf_counter() - t0
    if r.status_code != 201:
        raise RuntimeError(f"create failed: {r.status_code} {r.text}")
    body = r.json()
    if body["data"]["status"] != "running" or body["meta"].get("wait_timed_out"):
        raise RuntimeError(f"create did not reach running: {body}")
    return body["data"]["id"], dt


def gy_restart(c: httpx.Client, cid: str) -> float:
    r = c.post(f"/v1/clusters/{cid}/stop")
    r.raise_for_status()
    wait_status(c, cid, {"stopped"}, 0.05)
    t0 = time.perf_counter()
    r = c.post(f"/v1/clusters/{cid}/start", json={"wait_for_ready": True, "timeout_minutes": 2})
    dt = time.perf_counter() - t0
    r.raise_for_status()
    body = r.json()
    if body["data"]["status"] != "running" or body["meta"].get("wait_timed_out"):
        raise RuntimeError(f"start did not reach running: {body}")
    return dt


def gy_terminate(c: httpx.Client, cid: str) -> None:
    c.delete(f"/v1/clusters/{cid}").raise_for_status()
    wait_status(c, cid, {"terminated"}, 0.05)


def fresh_postgres() -> tuple[str, str]:
    """(the server's admin URL, the URL of a new empty database on it)."""
    admin = os.environ.get("GPUYARD_TEST_POSTGRES_URL") or subprocess.run(
        ["bash", str(Path(__file__).resolve().parent.parent / "scripts" / "test-postgres.sh")],
        capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    if not admin:
        raise RuntimeError("no PostgreSQL: set GPUYARD_TEST_POSTGRES_URL")
    name = f"gybench_start_{os.getpid()}"
    engine = sa.create_engine(admin, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}"'))
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    engine.dispose()
    return admin, admin.rsplit("/", 1)[0] + "/" + name


def drop_database(admin: str, url: str) -> None:
    engine = sa.create_engine(admin, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{url.rsplit("/", 1)[1]}" WITH (FORCE)'))
    engine.dispose()


def startup_samples(db_url: str) -> list[float]:
    """The server's recorded start durations, oldest first."""
    engine = sa.create_engine(db_url)
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT seconds FROM startup_samples ORDER BY id"))
        out = [float(r[0]) for r in rows]
    engine.dispose()
    return out


def stats_row(name: str, xs: list[float]) -> str:
    return (f"{name:<46} {median(xs) * 1000:>9.0f} {percentile(xs, 95) * 1000:>9.0f} "
            f"{min(xs) * 1000:>8.0f} {max(xs) * 1000:>8.0f}")  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--db", choices=("sqlite", "postgres"), default="sqlite")
    args = ap.parse_args()
    if shutil.which("podman") is None:
        print("podman is not installed (apt-get install podman)", file=sys.stderr)
        return 2

    # A short path: unix socket paths are limited to 108 bytes.
    work = Path(tempfile.mkdtemp(prefix="gy-bench-"))
    service = PodmanService(work / "podman.sock")
    server: subprocess.Popen[bytes] | None = None
    bare: Bare | None = None
    cids: list[str] = []
    bare_names: list[tuple[str, str]] = []
    home = work / "home"
    log = work / "server.log"
    env: dict[str, str] = {}
    key = ""
    pg_admin, db_url = "", f"sqlite:///{home / 'gpuyard.db'}"
    try:
        if args.db == "postgres":
            pg_admin, db_url = fresh_postgres()
        url = service.start()
        build_dev_image("podman", DEV_IMAGE)
        bare = Bare(url)
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
            # This host's storage cannot cap container disks (no XFS project quotas);
            # the bare runs set no cap either.
            "GPUYARD_ALLOW_UNENFORCED_DISK": "true",
            # Polling every 10 ms is past the default per-key limit: limits on, never reached.
            "GPUYARD_RATE_LIMIT_PER_KEY": "1e9",
            "GPUYARD_RATE_LIMIT_PER_SOURCE": "1e9",
            "GPUYARD_DATABASE_URL": db_url,
        }
        server, base, key = start_server(home, port, env, log)

        gy_c: list[float] = []
        gy_s: list[float] = []
        bare_c: list[float] = []
        bare_run: list[float] = []
        bare_start: list[float] = []
        with httpx.Client(
            base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=120
        ) as c:
            # One unmeasured warm-up of each path (first engine calls, SDK version probe).
            cid, _ = gy_create(c, -1)
            gy_restart(c, cid)
            gy_terminate(c, cid)
            bare.run_container(f"{PREFIX}-warm", f"{PREFIX}-vol-warm")
            bare.cleanup(f"{PREFIX}-warm", f"{PREFIX}-vol-warm")
            skip_samples = len(startup_samples(db_url))

            for i in range(args.runs):
                name, vol = f"{PREFIX}-{i}", f"{PREFIX}-vol-{i}"
                bare_names.append((name, vol))

                def gy_part() -> None:
                    cid, dt = gy_create(c, i)
                    cids.append(cid)
                    gy_c.append(dt)
                    gy_s.append(gy_restart(c, cid))

                def bare_part() -> None:
                    assert bare is not None
                    bare_c.append(bare.run_container(name, vol))
                    bare.run("rm", "-f", name)  # like gpuyard's stop: container gone
                    bare_run.append(bare.run_container(name, vol))
                    bare.run("stop", "-t", "2", name)
                    bare_start.append(bare.run("start", name))

                parts = [gy_part, bare_part] if i % 2 == 0 else [bare_part, gy_part]
                for part in parts:
                    part()
                # Clean up outside the timed windows, before the next run.
                gy_terminate(c, cids[-1])
                bare.cleanup(name, vol)
                print(f"  run {i + 1}/{args.runs}: gpuyard create {gy_c[-1] * 1000:.0f} ms, "
                      f"start {gy_s[-1] * 1000:.0f} ms; bare run {bare_c[-1] * 1000:.0f} ms",
                      flush=True)  # fmt: skip

        samples = startup_samples(db_url)[skip_samples:]
        rec_create, rec_start = samples[0::2], samples[1::2]

        print()
        print(f"Start latency over {args.runs} runs, store {args.db}, podman {podman_version(bare)}, image {DEV_IMAGE}, "
              f"cpus={os.cpu_count()}")  # fmt: skip
        print(f"{'ms':<46} {'median':>9} {'p95':>9} {'min':>8} {'max':>8}")
        print(stats_row("gpuyard create->running (POST wait_for_ready)", gy_c))
        if len(rec_create) == args.runs:
            print(stats_row("  server-recorded create->running", rec_create))
        print(stats_row("bare podman run -d (new volume)", bare_c))
        print(stats_row("gpuyard stopped->running (start wait_for_ready)", gy_s))
        if len(rec_start) == args.runs:
            print(stats_row("  server-recorded stopped->running", rec_start))
        print(stats_row("bare podman run -d (existing volume)", bare_run))
        print(stats_row("bare podman start (stopped container)", bare_start))
        print()
        r_create = median(gy_c) / median(bare_c)
        r_start = median(gy_s) / median(bare_run)
        r_start2 = median(gy_s) / median(bare_start)
        r_create95 = percentile(gy_c, 95) / percentile(bare_c, 95)
        r_start95 = percentile(gy_s, 95) / percentile(bare_run, 95)
        ok = r_create <= GOAL and r_start <= GOAL
        print(
            f"create->running  gpuyard/bare (podman run -d): median {r_create:.2f}x, p95 {r_create95:.2f}x"
        )
        print(f"stopped->running gpuyard/bare (podman run -d): median {r_start:.2f}x, p95 {r_start95:.2f}x"
              f"; vs podman start: median {r_start2:.2f}x")  # fmt: skip
        print(f"RATIO median gpuyard/bare: create {r_create:.2f}x, stopped->running {r_start:.2f}x "
              f"(goal <= {GOAL}x: {'MEETS' if ok else 'MISSES'})")  # fmt: skip
        return 0
    except Exception:
        print("--- server log ---\n" + tail(log), file=sys.stderr)
        raise
    finally:
        if server is not None and server.poll() is None and key:
            try:
                with httpx.Client(base_url=f"http://127.0.0.1:{env['GPUYARD_PORT']}",
                                  headers={"Authorization": f"Bearer {key}"}, timeout=30) as c:  # fmt: skip
                    for cid in cids:
                        st = c.get(f"/v1/clusters/{cid}").json()["data"]["status"]
                        if st != "terminated":
                            gy_terminate(c, cid)
            except Exception as e:  # best effort; the engine sweep below catches leftovers
                print(f"cleanup: {e}", file=sys.stderr)
        stop_process(server)
        if bare is not None:
            for name, vol in bare_names:
                bare.cleanup(name, vol)
            # Anything this run's server left behind (e.g. after a failure mid-run): only
            # objects labelled with its installation id, never anybody else's.
            mine = installation_label(home)
            if mine:
                subprocess.run(["podman", "--url", bare.url, "rm", "-f", "-v", "--filter",
                                f"label={mine}"], capture_output=True)  # fmt: skip
                subprocess.run(["podman", "--url", bare.url, "volume", "prune", "-f", "--filter",
                                f"label={mine}"], capture_output=True)  # fmt: skip
                # Its account networks too (the server removes an unused one only
                # after a grace period, and it is stopped before that).
                subprocess.run(["podman", "--url", bare.url, "network", "prune", "-f", "--filter",
                                f"label={mine}"], capture_output=True)  # fmt: skip
        service.stop()
        shutil.rmtree(work, ignore_errors=True)
        if pg_admin:
            drop_database(pg_admin, db_url)


def podman_version(bare: Bare | None) -> str:
    try:
        out = subprocess.run(["podman", "--version"], capture_output=True, text=True).stdout
        return out.split()[-1]
    except (OSError, IndexError):
        return "?"


if __name__ == "__main__":
    sys.exit(main())
