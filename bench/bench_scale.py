"""History must not slow the present: lists, single reads and restarts with 100,000
terminated clusters and 1,000,000 usage intervals in the database, against the same
with no history.

Two parts, each on SQLite and (with ``--postgres-url``, or GPUYARD_TEST_POSTGRES_URL)
on PostgreSQL, where the script creates and drops databases of its own:

- ``lists``: a store seeded by bench/_seed_scale.py (the history plus ``--live``
  running clusters, default 1,000) served by bench/_scale_server.py. Measures
  ``GET /v1/clusters?per_page=50`` and ``GET /v1/clusters/{id}`` req/s at 32
  connections (wrk, else bench/_loadgen.py; as bench_get_cluster.py), alternating,
  then the same two on a store with the live clusters only. Goal: list >= 0.5x get,
  on the history store.
- ``restart``: ``--restart-live`` running clusters (default 10,000, one host, the
  fake engine listing their containers as running) with and without the history.
  Each run starts a fresh server process on the seeded store and times, from the
  spawn, (1) the first answered ``GET /v1/clusters/{id}`` (polled every 10 ms) and
  (2) the first completed full reconcile pass (the server logs it with its epoch
  time). Runs alternate between the two stores. Goal: history/no history <= 1.5x
  for both (medians).

    .venv/bin/python bench/bench_scale.py [--part lists|restart|all] [--backend sqlite|postgres|all]
        [--terminated 100000] [--intervals 1000000] [--live 1000] [--restart-live 10000]
        [--rounds 2] [--runs 3] [--client auto|wrk|python]
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
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
from sqlalchemy import create_engine, text

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import BENCH_DIR, free_port, median, stop_process, tail
from _scale_server import FIRST_FULL_PASS
from _seed_scale import prepare_home, seed, write_running
from bench_get_cluster import Result, measure

LIST_GOAL = 0.5
RESTART_GOAL = 1.5


@dataclass
class Store:
    """A seeded store: its home, database URL (None: SQLite in the home), a live
    cluster's id, the API key and the running-ids file for the fake engine."""

    label: str
    home: Path
    url: str | None
    live: int
    cluster_id: str
    key: str
    running: Path


@contextmanager
def pg_database(admin_url: str) -> Iterator[str]:
    """A fresh database on the PostgreSQL server of ``admin_url``, dropped after."""
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    name = "gy_bench_" + uuid.uuid4().hex[:10]
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield admin_url.rsplit("/", 1)[0] + "/" + name
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def make_store(
    label: str, work: Path, url: str | None, terminated: int, intervals: int, live: int
) -> Store:
    home = work / label
    _, ctx = prepare_home(home, url, live)
    done = seed(ctx, terminated=terminated, intervals=intervals if terminated else 0, live=live)
    ctx.sessions.kw["bind"].dispose()
    running = work / f"{label}.running"
    write_running(running, done.live_ids)
    key = json.loads((home / "credentials").read_text())["api_key"]
    print(f"  {label}: {terminated} terminated, {done.intervals} intervals, {done.events} events, "
          f"{live} running; seeded in {done.seconds:.1f} s")  # fmt: skip
    return Store(label, home, url, live, done.live_ids[-1], key, running)


def spawn(store: Store, port: int, log: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, str(BENCH_DIR / "_scale_server.py"), "--home", str(store.home),
           "--port", str(port), "--live", str(store.live), "--running-file", str(store.running)]  # fmt: skip
    if store.url:
        cmd += ["--database-url", store.url]
    with log.open("ab") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)


def wait_answer(base: str, store: Store, proc: subprocess.Popen[bytes], log: Path) -> float:
    """Epoch time of the first 200 of GET /v1/clusters/{id} (polled every 10 ms)."""
    headers = {"Authorization": f"Bearer {store.key}"}
    deadline = time.monotonic() + 300
    with httpx.Client(base_url=base, headers=headers, timeout=5) as client:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited ({proc.returncode}):\n{tail(log)}")
            try:
                if client.get(f"/v1/clusters/{store.cluster_id}").status_code == 200:
                    return time.time()
            except httpx.HTTPError:
                pass
            time.sleep(0.01)
    raise RuntimeError(f"no answer:\n{tail(log)}")


def wait_full_pass(log: Path, proc: subprocess.Popen[bytes]) -> float:
    """Epoch time the server logged its first full reconcile pass."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        for line in log.read_text(errors="replace").splitlines():
            if FIRST_FULL_PASS in line:
                return float(line.split()[0])
        if proc.poll() is not None:
            raise RuntimeError(f"server exited ({proc.returncode}):\n{tail(log)}")
        time.sleep(0.02)
    raise RuntimeError(f"no full reconcile pass:\n{tail(log)}")


def restart_part(stores: list[Store], runs: int, work: Path) -> dict[str, tuple[float, float]]:
    samples: dict[str, list[tuple[float, float]]] = {s.label: [] for s in stores}
    for run in range(runs):
        order = stores if run % 2 == 0 else list(reversed(stores))
        for store in order:
            port = free_port()
            log = work / f"restart-{store.label}-{run}.log"
            t0 = time.time()
            proc = spawn(store, port, log)
            try:
                answered = wait_answer(f"http://127.0.0.1:{port}", store, proc, log)
                full = wait_full_pass(log, proc)
            finally:
                stop_process(proc)
            samples[store.label].append((answered - t0, full - t0))
            print(f"  run {run + 1} {store.label:<12} first answer {answered - t0:6.2f} s, "
                  f"first full reconcile pass {full - t0:6.2f} s")  # fmt: skip
    return {
        label: (median([a for a, _ in got]), median([f for _, f in got]))
        for label, got in samples.items()
    }


def lists_part(stores: list[Store], args: argparse.Namespace, client: str, work: Path) -> None:
    results: list[tuple[str, Result]] = []
    for store in stores:
        port = free_port()
        log = work / f"lists-{store.label}.log"
        proc = spawn(store, port, log)
        try:
            base = f"http://127.0.0.1:{port}"
            wait_answer(base, store, proc, log)
            targets = {
                "list": f"{base}/v1/clusters?per_page=50",
                "get": f"{base}/v1/clusters/{store.cluster_id}",
            }
            page = httpx.get(targets["list"], headers={"Authorization": f"Bearer {store.key}"})
            page.raise_for_status()
            assert len(page.json()["data"]["clusters"]) == 50, "the list page is not full"
            for rnd in range(args.rounds):
                names = ["list", "get"] if rnd % 2 == 0 else ["get", "list"]
                for name in names:
                    res = measure(name, rnd + 1, targets[name], store.key, proc.pid, client, args)
                    if res.errors:
                        raise RuntimeError(f"{store.label} {name}: {res.errors} errors")
                    results.append((store.label, res))
        except Exception:
            print(tail(log), file=sys.stderr)
            raise
        finally:
            stop_process(proc)
    print(f"  {'store':<12} {'target':<5} {'round':>5} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} "
          f"{'srv CPU%':>8}")  # fmt: skip
    for label, r in results:
        print(f"  {label:<12} {r.target:<5} {r.round:>5} {r.rps:>8.0f} {r.p50_ms:>8.2f} "
              f"{r.p99_ms:>8.2f} {r.server_cpu:>8.0f}")  # fmt: skip
    mean: dict[tuple[str, str], float] = {}
    for store in stores:
        for target in ("list", "get"):
            got = [r.rps for label, r in results if label == store.label and r.target == target]
            mean[(store.label, target)] = sum(got) / len(got)
    for store in stores:
        ratio = mean[(store.label, "list")] / mean[(store.label, "get")]
        verdict = "MEETS" if ratio >= LIST_GOAL else "MISSES"
        print(f"RATIO [{store.label}] list(per_page=50)/get req/s = {ratio:.2f}x "
              f"(goal >= {LIST_GOAL}x: {verdict})")  # fmt: skip
    history, empty = stores[0].label, stores[1].label
    for target in ("list", "get"):
        ratio = mean[(history, target)] / mean[(empty, target)]
        print(f"RATIO {target} req/s with history / without = {ratio:.2f}x")


def run_backend(backend: str, admin_url: str | None, args: argparse.Namespace, client: str) -> None:
    work = Path(tempfile.mkdtemp(prefix=f"gy-bench-scale-{backend}-"))
    try:
        with _databases(admin_url, 4) as urls:
            if args.part in ("lists", "all"):
                print(f"[{backend}] lists: seeding")
                stores = [
                    make_store("history", work, urls[0], args.terminated, args.intervals,
                               args.live),
                    make_store("no-history", work, urls[1], 0, 0, args.live),
                ]  # fmt: skip
                print(f"[{backend}] GET /v1/clusters?per_page=50 vs GET /v1/clusters/{{id}}: "
                      f"{args.connections} connections, warm-up {args.warmup:g} s, "
                      f"{args.duration:g} s measured, {args.rounds} round(s), client={client}, "
                      f"cpus={os.cpu_count()}")  # fmt: skip
                lists_part(stores, args, client, work)
            if args.part in ("restart", "all"):
                print(f"[{backend}] restart: seeding ({args.restart_live} running on one host)")
                stores = [
                    make_store("r-history", work, urls[2], args.terminated, args.intervals,
                               args.restart_live),
                    make_store("r-no-history", work, urls[3], 0, 0, args.restart_live),
                ]  # fmt: skip
                got = restart_part(stores, args.runs, work)
                (ha, hf), (ea, ef) = got["r-history"], got["r-no-history"]
                print(f"  median first answer: history {ha:.2f} s, no history {ea:.2f} s; "
                      f"first full pass: history {hf:.2f} s, no history {ef:.2f} s")  # fmt: skip
                for what, ratio in (("first answer", ha / ea), ("first full pass", hf / ef)):
                    verdict = "MEETS" if ratio <= RESTART_GOAL else "MISSES"
                    print(f"RATIO [{backend}] restart to {what} history/no history = "
                          f"{ratio:.2f}x (goal <= {RESTART_GOAL}x: {verdict})")  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)


@contextmanager
def _databases(admin_url: str | None, n: int) -> Iterator[list[str | None]]:
    """``n`` database URLs: None each (SQLite in the store's home), or fresh PostgreSQL
    databases dropped afterwards."""
    if admin_url is None:
        yield [None] * n
        return
    with (
        pg_database(admin_url) as a,
        pg_database(admin_url) as b,
        pg_database(admin_url) as c,
        pg_database(admin_url) as d,
    ):
        urls: list[str | None] = [a, b, c, d]
        yield urls[:n]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--part", choices=["lists", "restart", "all"], default="all")
    ap.add_argument("--backend", choices=["sqlite", "postgres", "all"], default="all")
    ap.add_argument("--postgres-url", default=os.environ.get("GPUYARD_TEST_POSTGRES_URL", ""))
    ap.add_argument("--terminated", type=int, default=100_000)
    ap.add_argument("--intervals", type=int, default=1_000_000)
    ap.add_argument("--live", type=int, default=1_000)
    ap.add_argument("--restart-live", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3, help="restarts per store")
    ap.add_argument("--connections", type=int, default=32)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--duration", type=float, default=8.0)
    ap.add_argument("--client", choices=["auto", "wrk", "python"], default="auto")
    args = ap.parse_args()
    client = args.client
    if client == "auto":
        client = "wrk" if shutil.which("wrk") else "python"
    backends = ["sqlite", "postgres"] if args.backend == "all" else [args.backend]
    for backend in backends:
        if backend == "postgres":
            if not args.postgres_url:
                print("postgres: skipped (no --postgres-url; "
                      "GPUYARD_TEST_POSTGRES_URL=$(bash scripts/test-postgres.sh))")  # fmt: skip
                continue
            run_backend(backend, args.postgres_url.strip(), args, client)
        else:
            run_backend(backend, None, args, client)
    return 0


if __name__ == "__main__":
    sys.exit(main())
