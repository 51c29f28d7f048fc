"""Placement throughput on a 10,000-host fleet vs the bare commit rate of the database.

A fleet of host rows (8 x A6000, 64 vCPUs, 512 GB, 4 TB each; no engines: placement
makes no runtime call) in a fresh store, then a stream of one-GPU creates, one after
the other on one thread (one core), each a durable committed transaction:

- ``create``: the real use case, services/clusters.create_cluster (cluster row, the
  placement lock, candidate hosts, GPU and reservation rows, ports, event, usage
  interval), as an API request runs it, less HTTP;
- ``claim``: what a placement needs durably, alone: a cluster row and
  services/placement.claim (the lock, candidate hosts, GPU and reservation rows);
- ``create, N threads``: the same use case from ``--threads`` threads at once, as
  concurrent API requests run it: the process's placer records the creates that wait
  together in one transaction (services/capacity/placement_batch.py), the plain ones
  decided in memory and written per table at once (services/clusters/create_batch.py).
  Printed with the p50 and p99 latency of one create under that load, the mean batch
  size and the share of creates the batch writer recorded.

The baseline, measured in the same run on the same database through the same engine
(same pool, pragmas and SQLite BEGIN IMMEDIATE): a one-row INSERT per transaction, and,
for reference, the same through the bare driver (sqlite3 / psycopg). Goal: placements
per second >= 0.5 x the one-row insert rate, on SQLite and on PostgreSQL.

    .venv/bin/python bench/bench_placement.py [--hosts 10000] [--creates 1000]
        [--threads 32] [--db sqlite,postgres] [--pg-url URL]

PostgreSQL: --pg-url, else GPUYARD_TEST_POSTGRES_URL, else scripts/test-postgres.sh
(a throwaway server); a database is made for the run and dropped after.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, insert, text
from sqlalchemy.engine import Engine

from gpuyard.core.ids import new_cluster_id
from gpuyard.core.models import ResourceRequest
from gpuyard.services.capacity.placement import claim
from gpuyard.services.capacity.placement_batch import placer_for
from gpuyard.services.clusters.requests import CreateCluster
from gpuyard.services.clusters.use_cases import create_cluster
from gpuyard.services.context import Context
from gpuyard.services.installation.bootstrap import first_start, open_store
from gpuyard.services.tenancy.auth import Principal, Scope, create_account, issue_key, resolve_key
from gpuyard.settings import Settings
from gpuyard.store.db import WRITE_OPTIONS
from gpuyard.store.schema import Cluster, Host, HostGpu

BENCH_DIR = Path(__file__).resolve().parent
A6000 = "NVIDIA RTX A6000"
GPUS_PER_HOST = 8


def populate(engine: Engine, hosts: int) -> None:
    """``hosts`` active, healthy hosts in 20 locations, half SECURE, half COMMUNITY."""
    now = datetime.now(UTC)
    host_rows: list[dict[str, Any]] = [
        {
            "id": 1000 + i, "name": f"gpu{i:05d}", "location": f"dc{i % 20:02d}",
            "cloud_type": "SECURE" if i % 2 else "COMMUNITY", "address": f"10.0.{i // 250}.{i % 250}",
            "engine_url": f"ssh://root@gpu{i:05d}", "vcpus": 64, "memory_gb": 512,
            "disk_gb": 4000, "gpu_source": "declared", "declared": [], "healthy": True,
            "status": "active", "is_local": False, "created_at": now, "updated_at": now,
        }
        for i in range(hosts)
    ]  # fmt: skip
    gpu_rows = [
        {"host_id": 1000 + i, "gpu_index": g, "gpu_type": A6000, "uuid": None}
        for i in range(hosts)
        for g in range(GPUS_PER_HOST)
    ]
    with engine.begin() as conn:
        for start in range(0, len(host_rows), 2000):
            conn.execute(insert(Host), host_rows[start : start + 2000])
        for start in range(0, len(gpu_rows), 5000):
            conn.execute(insert(HostGpu), gpu_rows[start : start + 5000])
        conn.execute(text("CREATE TABLE bench_bare (id INTEGER PRIMARY KEY, v VARCHAR(20))"))
    if engine.dialect.name == "postgresql":
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("ANALYZE"))


def principal(ctx: Context) -> Principal:
    with ctx.transaction() as session:
        user, account, _ = create_account(session, email="bench@example.com", name="bench")
        key = issue_key(
            session, user_id=user.id, account_id=account.id, name="b", scope=Scope.WRITE
        )
    with ctx.read() as session:
        return resolve_key(session, key.key)


def rate(n: int, step: Callable[[int], None]) -> float:
    """Operations per second of ``n`` calls of ``step`` (after 20 unmeasured)."""
    for i in range(20):
        step(-1 - i)
    t0 = time.perf_counter()
    for i in range(n):
        step(i)
    return n / (time.perf_counter() - t0)


def bare_sqlalchemy(engine: Engine) -> Callable[[int], None]:
    counter = iter(range(10**9))

    def step(_: int) -> None:
        with engine.connect().execution_options(**WRITE_OPTIONS) as conn, conn.begin():
            conn.execute(
                text("INSERT INTO bench_bare (id, v) VALUES (:id, 'x')"), {"id": next(counter)}
            )

    return step


def bare_driver(engine: Engine, url: str) -> Callable[[int], None]:
    counter = iter(range(10**9, 2 * 10**9))
    if engine.dialect.name == "sqlite":
        conn = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")

        def step(_: int) -> None:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO bench_bare (id, v) VALUES (?, 'x')", (next(counter),))
            conn.execute("COMMIT")

        return step
    import psycopg

    pg = psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"))

    def pg_step(_: int) -> None:
        with pg.transaction():
            pg.execute("INSERT INTO bench_bare (id, v) VALUES (%s, 'x')", (next(counter),))

    return pg_step


def create_step(ctx: Context, who: Principal) -> Callable[[int], None]:
    body = CreateCluster(name="c", gpu_type=A6000, gpu_count=1, docker_image="img")

    def step(_: int) -> None:
        create_cluster(ctx, who, body)

    return step


def claim_step(ctx: Context, project_id: int) -> Callable[[int], None]:
    request = ResourceRequest(gpu_type=A6000, gpu_count=1, vcpus=2, memory_gb=4, disk_gb=10)

    def step(_: int) -> None:
        now = ctx.clock.now()
        with ctx.transaction() as session:
            cid = new_cluster_id()
            session.add(
                Cluster(
                    id=cid, project_id=project_id, name="c", image="img", gpu_type=A6000,
                    gpu_count=1, cpu_cores=2, memory_gb=4, container_disk_gb=10, volume_gb=0,
                    volume_mount_path="/workspace", cloud_type="SECURE",
                    desired_status="running", status="starting", created_at=now,
                    updated_at=now, version=1,
                )
            )  # fmt: skip
            session.flush()
            placement = claim(
                session,
                cluster_id=cid,
                request=request,
                volume_gb=0,
                ratios=ctx.settings.allocation_ratios,
                now=now,
                policy=ctx.settings.placement_policy,
            )
            row = session.get(Cluster, cid)
            assert row is not None
            row.host_id, row.gpu_indices = placement.host_id, list(placement.gpu_indices)

    return step


class Concurrent:
    """``threads`` threads issuing creates at once; keeps every create's latency."""

    def __init__(self, ctx: Context, who: Principal, threads: int) -> None:
        self.ctx, self.who, self.threads = ctx, who, threads
        self.latencies: list[float] = []
        self.batches = self.steps = self.written = 0

    def rate(self, n: int) -> float:
        body = CreateCluster(name="c", gpu_type=A6000, gpu_count=1, docker_image="img")
        per = max(1, n // self.threads)
        start = threading.Barrier(self.threads + 1)
        lock = threading.Lock()
        placer = placer_for(self.ctx)
        batches, steps, written = placer.batches, placer.steps, placer.written

        def worker() -> None:
            mine = []
            start.wait()
            for _ in range(per):
                t = time.perf_counter()
                create_cluster(self.ctx, self.who, body)
                mine.append(time.perf_counter() - t)
            with lock:
                self.latencies.extend(mine)

        workers = [threading.Thread(target=worker) for _ in range(self.threads)]
        for w in workers:
            w.start()
        start.wait()
        t0 = time.perf_counter()
        for w in workers:
            w.join()
        elapsed = time.perf_counter() - t0
        self.batches += placer.batches - batches
        self.steps += placer.steps - steps
        self.written += placer.written - written
        return per * self.threads / elapsed

    def percentile(self, q: float) -> float:
        return statistics.quantiles(self.latencies, n=100)[int(q) - 1] * 1000


@contextmanager
def postgres_database(url: str) -> Iterator[str]:
    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    name = "gy_bench_" + uuid.uuid4().hex[:10]
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield url.rsplit("/", 1)[0] + "/" + name
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def run(label: str, url: str, args: argparse.Namespace, hosts: int) -> dict[str, float]:
    """Each series' rate per second on a fresh fleet of ``hosts`` hosts at ``url``."""
    home = Path(tempfile.mkdtemp(prefix="gy-place-"))
    settings = Settings(home=home, database_url=url, local_gpus="", placement_policy=args.policy)
    engine, sessions = open_store(settings)
    ctx = Context(sessions=sessions, settings=settings)
    first_start(ctx)  # no local host: the fleet is the rows written here
    t0 = time.perf_counter()
    populate(engine, hosts)
    label = f"{label} {hosts} hosts"
    print(f"[{label}] {hosts} hosts x {GPUS_PER_HOST} GPUs written in "
          f"{time.perf_counter() - t0:.1f} s; policy {args.policy}")  # fmt: skip
    who = principal(ctx)
    results: dict[str, float] = {}
    # Interleaved rounds so drift (other load on the machine) hits every series alike.
    per_round = max(1, args.creates // args.rounds)
    series = {
        "bare insert (SQLAlchemy)": bare_sqlalchemy(engine),
        "bare insert (driver)": bare_driver(engine, url),
        "create (use case)": create_step(ctx, who),
        "claim + cluster row": claim_step(ctx, who.default_project_id),
    }
    threaded = f"create, {args.threads} threads"
    load = Concurrent(ctx, who, args.threads)
    totals = {name: 0.0 for name in [*series, threaded]}
    counts = dict.fromkeys(totals, 0)
    for _ in range(args.rounds):
        for name, step in series.items():
            n = per_round * (4 if name.startswith("bare") else 1)
            totals[name] += n / rate(n, step)  # seconds
            counts[name] += n
        if args.threads:
            n = per_round * 4
            done = max(1, n // args.threads) * args.threads
            totals[threaded] += done / load.rate(n)
            counts[threaded] += done
    for name in totals:
        if counts[name]:
            results[name] = counts[name] / totals[name]
    engine.dispose()
    base = results["bare insert (SQLAlchemy)"]
    print(f"[{label}] {'series':<28}{'per second':>12}{'x bare':>9}")
    for name, value in results.items():
        print(f"[{label}] {name:<28}{value:>12.0f}{value / base:>9.2f}")
    if args.threads:
        print(f"[{label}] {threaded}: latency p50 {load.percentile(50):.1f} ms, "
              f"p99 {load.percentile(99):.1f} ms; mean batch "
              f"{load.steps / max(1, load.batches):.1f} creates per commit, "
              f"{100 * load.written / max(1, load.steps):.0f}% recorded by the batch writer")  # fmt: skip
        results["p50 ms"], results["p99 ms"] = load.percentile(50), load.percentile(99)
    return results


def report(
    label: str,
    args: argparse.Namespace,
    big: dict[str, float],
    small: dict[str, float] | None = None,
) -> None:
    small = small or {}
    base = big["bare insert (SQLAlchemy)"]
    for name in ("create (use case)", "claim + cluster row", f"create, {args.threads} threads"):
        if name not in big:
            continue
        ratio = big[name] / base
        print(f"RATIO [{label}] {name} on {args.hosts} hosts: {ratio:.2f}x bare one-row "
              f"insert commits (goal >= 0.5x: {'MET' if ratio >= 0.5 else 'MISSED'})")  # fmt: skip
        if name in small:
            print(f"SCALE [{label}] {name}: {big[name]:.0f}/s on {args.hosts} hosts vs "
                  f"{small[name]:.0f}/s on {args.small_hosts} ({big[name] / small[name]:.2f}x)")  # fmt: skip
    if "p99 ms" in big:
        print(f"LATENCY [{label}] create under {args.threads} threads on {args.hosts} hosts: "
              f"p50 {big['p50 ms']:.1f} ms, p99 {big['p99 ms']:.1f} ms")  # fmt: skip


def fitting(args: argparse.Namespace, hosts: int) -> argparse.Namespace:
    """``args`` with no more creates than a fleet of ``hosts`` holds for one cloud type
    (half the hosts, :func:`populate`): each round places ``creates / rounds`` clusters
    of one GPU after 20 unmeasured ones in each single-threaded series, and four times
    as many (at least one per thread) in the threaded one."""
    usable = hosts * GPUS_PER_HOST // 2
    spare = usable // args.rounds - 40 - args.threads
    per_round = max(1, spare // (6 if args.threads else 2))
    return argparse.Namespace(
        **{**vars(args), "creates": min(args.creates, per_round * args.rounds)}
    )


def pg_url(arg: str | None) -> str | None:
    if arg:
        return arg
    if os.environ.get("GPUYARD_TEST_POSTGRES_URL"):
        return os.environ["GPUYARD_TEST_POSTGRES_URL"]
    out = subprocess.run(
        ["bash", str(BENCH_DIR.parent / "scripts" / "test-postgres.sh")],
        capture_output=True,
        text=True,
        check=False,
    )
    return out.stdout.strip() or None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=10_000)
    ap.add_argument("--small-hosts", type=int, default=100, help="the fleet to compare with")
    ap.add_argument("--creates", type=int, default=1_000, help="placements per series")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--threads", type=int, default=32, help="concurrent creators (0: none)")
    ap.add_argument("--db", default="sqlite,postgres")
    ap.add_argument("--policy", default="binpack", choices=["binpack", "spread"])
    ap.add_argument("--pg-url", default=None)
    args = ap.parse_args()
    for db in args.db.split(","):
        if db == "sqlite":
            runs = []
            for hosts in (args.hosts, args.small_hosts)[: 2 if args.small_hosts else 1]:
                path = Path(tempfile.mkdtemp(prefix="gy-place-db-")) / "bench.db"
                runs.append(run("sqlite", f"sqlite:///{path}", fitting(args, hosts), hosts))
            report("sqlite", args, *runs)
        elif db == "postgres":
            url = pg_url(args.pg_url)
            if url is None:
                print("[postgres] skipped: no PostgreSQL (--pg-url, GPUYARD_TEST_POSTGRES_URL)")
                continue
            runs = []
            for hosts in (args.hosts, args.small_hosts)[: 2 if args.small_hosts else 1]:
                with postgres_database(url) as db_url:
                    runs.append(run("postgres", db_url, fitting(args, hosts), hosts))
            report("postgres", args, *runs)


if __name__ == "__main__":
    main()
