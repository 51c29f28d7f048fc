"""Diagnostic companion of bench_start_latency.py, in two parts against a private
podman service:

1. the engine calls gpuyard's reconciler makes for one create->running
   (ClusterDriver._start), timed one by one through DockerEngineRuntime, next to a bare
   ``podman run -d``;
2. create->running and stopped->running through the real use cases and
   ``ClusterDriver.drive`` in this process (a real store: SQLite, or PostgreSQL with
   ``--database-url``), every runtime call timed, so what is left is gpuyard's own
   bookkeeping between engine calls (transactions, reads, building the spec). The HTTP
   request and the reconciler's wake-up are not in it (bench_start_latency.py has
   those).

    .venv/bin/python bench/profile_start_path.py [--runs 10] [--database-url URL]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import docker
from sqlalchemy import event

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DEV_IMAGE, median

from gpuyard.core.ownership import Ownership
from gpuyard.reconciler.wiring import build_reconciler
from gpuyard.runtimes.base import ContainerSpec, PortBinding
from gpuyard.runtimes.engines.devimage import build_dev_image
from gpuyard.runtimes.engines.engine import EnginePolicy
from gpuyard.runtimes.engines.runtime import DockerEngineRuntime
from gpuyard.runtimes.engines.url import PodmanService
from gpuyard.services.clusters import use_cases as uc
from gpuyard.services.clusters.requests import CreateCluster, StartCluster
from gpuyard.services.context import Context
from gpuyard.services.installation.bootstrap import first_start, open_store, register_local_host
from gpuyard.services.tenancy.auth import (
    Principal,
    Scope,
    create_account,
    issue_key,
    resolve_key,
)
from gpuyard.settings import Settings


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--database-url", default=None, help="the store (default: SQLite, temp)")
    ap.add_argument("--driver-only", action="store_true", help="skip part 1")
    ap.add_argument(
        "--show-sql", action="store_true", help="print the last run's statements, per step"
    )
    args = ap.parse_args()
    runs = args.runs
    work = Path(tempfile.mkdtemp(prefix="gy-prof-"))
    service = PodmanService(work / "podman.sock")
    url = service.start()
    times: dict[str, list[float]] = defaultdict(list)
    try:
        build_dev_image("podman", DEV_IMAGE)
        owner = Ownership.new()
        rt = DockerEngineRuntime(url, owner=owner)
        rt.available()
        rt.capabilities()
        client: Any = docker.DockerClient(base_url=url, version="auto")

        def timed(label: str, fn: Any, *a: Any, **k: Any) -> Any:
            t0 = time.perf_counter()
            out = fn(*a, **k)
            times[label].append(time.perf_counter() - t0)
            return out

        for i in range(-1, runs if not args.driver_only else -1):  # run -1: a warm-up
            cid = f"gyprof{i + 1:02d}xx"
            vol = owner.volume(cid)
            spec = ContainerSpec(
                cluster_id=cid, image=DEV_IMAGE, command=None, env={"CUDA_VISIBLE_DEVICES": "0"},
                ports=(PortBinding(8888, 21000 + i + 1, "tcp"),), volume_name=vol,
                volume_mount_path="/workspace", cpu_cores=2.0, memory_gb=4.0, gpu_indices=(0,),
                gpu_uuids=(), labels={},
            )  # fmt: skip
            t_all = time.perf_counter()
            timed("1 ensure_volume (inspect 404 + create)", rt.ensure_volume, vol)
            timed("2 ensure_image (inspect)", rt.ensure_image, DEV_IMAGE)
            timed(
                "3a create: remove old container (404)",
                rt.engine.remove_container,
                owner.container(cid),
            )
            timed("3b create: ensure_volume again (inspect)", rt.ensure_volume, vol)
            timed("3c create: containers.create (POST + SDK GET)", rt._create, spec)
            timed("4 start (POST start)", rt.start, cid)
            timed("5 observe (inspect) until running", rt.observe, cid)
            times["= all engine calls of one start"].append(time.perf_counter() - t_all)
            rt.stop(cid, timeout_s=2)
            rt.remove_volume(vol)
            # Bare comparison on the same engine.
            t0 = time.perf_counter()
            subprocess.run(["podman", "--url", url, "run", "-d", "--name", f"bare-{cid}", "-p", "8888",
                            "-v", f"bare-{vol}:/workspace", "--cpus", "2", "--memory", "4g",
                            DEV_IMAGE], check=True, capture_output=True)  # fmt: skip
            times["bare podman run -d (CLI, remote)"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            ctr = client.containers.run(DEV_IMAGE, detach=True, name=f"sdk-{cid}",
                                        ports={"8888/tcp": None},
                                        volumes={f"sdk-{vol}": {"bind": "/workspace", "mode": "rw"}},
                                        nano_cpus=2_000_000_000, mem_limit=4 * 1024**3)  # fmt: skip
            times["bare docker SDK containers.run (create+start)"].append(time.perf_counter() - t0)
            ctr.remove(force=True, v=True)
            subprocess.run(["podman", "--url", url, "rm", "-f", f"bare-{cid}"], capture_output=True)
            for v in (f"bare-{vol}", f"sdk-{vol}"):
                subprocess.run(
                    ["podman", "--url", url, "volume", "rm", "-f", v], capture_output=True
                )
            if i < 0:
                times.clear()
        print(f"engine calls of one gpuyard start vs bare, median of {runs} (ms):")
        for label in sorted(times):
            print(f"  {label:<50} {median(times[label]) * 1000:>7.1f}")
        db = args.database_url or f"sqlite:///{work / 'profile.db'}"
        profile_driver(url, runs, db, work / "home", show_sql=args.show_sql)
        return 0
    finally:
        service.stop()
        shutil.rmtree(work, ignore_errors=True)


# -- gpuyard's own steps: the reconciler's driver in this process ---------------------


class Timed:
    """A runtime whose every call is timed (name, start, end), forwarding to ``inner``."""

    def __init__(self, inner: Any, calls: list[tuple[str, float, float]]) -> None:
        self._inner = inner
        self._calls = calls

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._inner, name)
        if not callable(target) or name.startswith("__"):
            return target
        calls = self._calls

        def timed(*a: Any, **k: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return target(*a, **k)
            finally:
                calls.append((name, t0, time.perf_counter()))

        return timed


def profile_driver(
    url: str, runs: int, database_url: str, home: Path, *, show_sql: bool = False
) -> None:
    """create->running and stopped->running through ClusterDriver.drive with a real
    store and the real engine: per step, the engine calls (timed one by one), the rest
    (gpuyard's bookkeeping: transactions, reads, spec building) and how many SQL
    statements each part sent (``show_sql``: the last run's, one line each)."""
    settings = Settings(
        home=home, database_url=database_url, local_gpus="NVIDIA RTX A6000:8",
        local_vcpus=64, local_memory_gb=512, local_disk_gb=2000, allow_unenforced_disk=True,
    )  # fmt: skip
    engine, sessions = open_store(settings)
    statements: list[str] = []
    began: list[float] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_rest: Any) -> None:
        began.append(time.perf_counter())
        statements.append(" ".join(statement.split())[:100])

    def timed(*_args: Any) -> None:
        # Each statement's line says when it began (ms since the phase's request) and
        # how long it took.
        if statements and not statements[-1].startswith("+"):
            took = (time.perf_counter() - began[-1]) * 1000
            statements[-1] = (
                f"+{(began[-1] - phase_began[0]) * 1000:7.1f} {took:5.1f} {statements[-1]}"
            )

    phase_began = [0.0]
    event.listen(engine, "before_cursor_execute", count)
    event.listen(engine, "after_cursor_execute", timed)
    ctx = Context(sessions=sessions, settings=settings)
    first_start(ctx)
    register_local_host(ctx, None)
    principal = bench_principal(ctx)
    calls: list[tuple[str, float, float]] = []
    policy = EnginePolicy(manage_host_firewall=True, allow_unenforced_disk=True)
    inner = DockerEngineRuntime(url, policy=policy)
    rec = build_reconciler(ctx, Timed(inner, calls))
    phases: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    body = CreateCluster.model_validate(
        {"gpu_type": "NVIDIA RTX A6000", "gpu_count": 1, "docker_image": DEV_IMAGE,
         "volume_gb": 1, "ports": [{"internal_port": 8888, "external_port": 0,
                                     "protocol": "http"}]}
    )  # fmt: skip

    shown: dict[str, list[str]] = {}

    def drive_until(cid: str, want: str, phase: str, t_request: float) -> None:
        calls.clear()
        in_use_case = len(statements)
        t0 = time.perf_counter()
        for _ in range(10):
            rec.driver.drive(cid)
            if uc.get_cluster(ctx, principal, cid).status == want:
                break
        t1 = time.perf_counter()
        per = phases[phase]
        # Counts, kept as "seconds" so the table prints them (x1000: shown as is).
        per["# statements: use case"].append(in_use_case / 1000)
        per["# statements: drive"].append((len(statements) - in_use_case) / 1000)
        lines = list(statements) + [
            f"+{(a - t_request) * 1000:7.1f} {(b - a) * 1000:5.1f} ENGINE {name}"
            for name, a, b in calls
        ]
        shown[phase] = sorted(lines, key=lambda line: float(line[1:8]))
        statements.clear()
        engine_s = 0.0
        for name, a, b in calls:
            per[f"engine {name}"].append(b - a)
            engine_s += b - a
        per["= use case (API transaction)"].append(t0 - t_request)
        per["= drive: engine calls"].append(engine_s)
        per["= drive: gpuyard's own (store, specs)"].append(t1 - t0 - engine_s)
        per["= total"].append(t1 - t_request)

    try:
        cids: list[str] = []
        for i in range(-1, runs):
            statements.clear()
            t = phase_began[0] = time.perf_counter()
            c = uc.create_cluster(ctx, principal, body)
            drive_until(c.id, "running", "create->running", t)
            uc.stop_cluster(ctx, principal, c.id)
            for _ in range(5):
                rec.driver.drive(c.id)
            statements.clear()
            t = phase_began[0] = time.perf_counter()
            uc.start_cluster(ctx, principal, c.id, StartCluster())
            drive_until(c.id, "running", "stopped->running", t)
            uc.terminate_cluster(ctx, principal, c.id)
            for _ in range(5):
                rec.driver.drive(c.id)
            cids.append(c.id)
            if i < 0:
                phases.clear()
        for phase, per in phases.items():
            print(f"\n{phase} through ClusterDriver.drive, median of {runs} (ms; one call's "
                  f"median times how often it ran per start):")  # fmt: skip
            for label in sorted(per):
                xs = per[label]
                n = len(xs) / runs
                extra = f"  x{n:.1f}" if label.startswith("engine") else ""
                print(f"  {label:<50} {median(xs) * 1000:>7.1f}{extra}")
        if show_sql:
            for phase, lines in shown.items():
                print(f"\n{phase}: the last run's statements")
                for line in lines:
                    print(f"  {line}")
    finally:
        subprocess.run(["podman", "--url", url, "rm", "-f", "--filter",
                        f"label={ctx.ownership.label_filter()}"], capture_output=True)  # fmt: skip
        engine.dispose()


def bench_principal(ctx: Context) -> Principal:
    with ctx.transaction() as session:
        user, account, _ = create_account(session, email="bench@example.com", name="bench")
        key = issue_key(
            session, user_id=user.id, account_id=account.id, name="bench", scope=Scope.WRITE
        )
    with ctx.read() as session:
        return resolve_key(session, key.key)


if __name__ == "__main__":
    sys.exit(main())
