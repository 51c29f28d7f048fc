"""Auto-termination at scale: 10,000 running clusters with policies on the fake runtime.

Measures (1) the reconciler's CPU share of one core at steady state, while no
deadline is due, and (2) the firing lag (time fired - deadline) of 1,000 deadlines
spread over a minute, p50/p99. Goals: p99 lag <= 1 s, steady-state CPU < 5 % of a core.

The clusters are written straight into a fresh SQLite store (status running, policy
set, run start chosen so the deadlines fall where wanted); the real Reconciler with
its AutoTerminator runs in this process against the in-memory FakeRuntime, so the
process's CPU time is the reconciler's.

    .venv/bin/python bench/bench_autoterminate.py [--clusters 10000] [--firing 1000]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import insert, select

from gpuyard.core.ids import new_cluster_id
from gpuyard.reconciler.duties.autoterminate import Fired
from gpuyard.reconciler.wiring import build_reconciler
from gpuyard.services.context import Context
from gpuyard.services.installation.bootstrap import first_start, open_store, register_local_host
from gpuyard.settings import Settings
from gpuyard.store.schema import Cluster, Project
from gpuyard.testing.fake_runtime import FakeRuntime


def populate(ctx: Context, total: int, firing: int, fire_from: float, fire_span: float) -> None:
    now = datetime.now(UTC)
    with ctx.transaction() as session:
        project = session.scalar(select(Project.id).limit(1))
        rows: list[dict[str, Any]] = []
        for i in range(total):
            if i < firing:
                # max runtime 1 h; the run began so that it ends fire_from + i*step from now
                due = now + timedelta(seconds=fire_from + fire_span * i / firing)
                policy = {"enabled": True, "max_runtime_hours": 1.0, "action": "stop"}
                started = due - timedelta(hours=1)
            else:
                started = now
                policy = (
                    {"enabled": True, "max_runtime_hours": 48.0}
                    if i % 2
                    else {"enabled": True, "cost_limit_usd": 1000.0, "action": "terminate"}
                )
            rows.append(
                {
                    "id": new_cluster_id(), "project_id": project, "name": f"c{i}",
                    "image": "img", "docker_args": "", "env": {}, "ports": [],
                    "gpu_type": None, "gpu_count": 0, "cpu_cores": 1, "memory_gb": 1,
                    "container_disk_gb": 10, "volume_gb": 0, "volume_mount_path": "/workspace",
                    "cloud_type": "SECURE", "interruptible": False, "auto_terminate": policy,
                    "desired_status": "running", "status": "running", "status_reason": "running",
                    "startup_step": 8, "host_id": 1, "gpu_indices": [], "runtime_handle": {},
                    "start_initiated_at": started, "started_at": started, "created_at": started,
                    "updated_at": started, "version": 1,
                }
            )  # fmt: skip
        session.execute(insert(Cluster), rows)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clusters", type=int, default=10_000)
    ap.add_argument("--firing", type=int, default=1_000)
    ap.add_argument("--steady", type=float, default=20.0, help="seconds of steady state")
    ap.add_argument("--span", type=float, default=60.0, help="seconds the deadlines spread over")
    args = ap.parse_args()

    home = Path(tempfile.mkdtemp(prefix="gy-autoterm-"))
    settings = Settings(home=home, local_gpus="", local_vcpus=100_000, local_memory_gb=100_000,
                        local_disk_gb=10_000_000, reconcile_interval_s=2.0)  # fmt: skip
    engine, sessions = open_store(settings)
    ctx = Context(sessions=sessions, settings=settings)
    first_start(ctx)
    register_local_host(ctx, None)
    t0 = time.perf_counter()
    fire_from = args.steady + 8.0
    populate(ctx, args.clusters, args.firing, fire_from, args.span)
    print(f"{args.clusters} running clusters with policies written in "
          f"{time.perf_counter() - t0:.1f} s; {args.firing} deadlines over {args.span:.0f} s")  # fmt: skip

    lags: list[float] = []
    lock = threading.Lock()

    def on_fire(f: Fired) -> None:
        with lock:
            lags.append((datetime.now(UTC) - f.deadline).total_seconds())

    # No engine observation: the fake runtime has no containers for these rows.
    rec = build_reconciler(ctx, FakeRuntime(), observe_every_s=1e9, on_fire=on_fire)
    rec.start()
    rec.wake()
    time.sleep(5.0)  # first pass reads every cluster once
    cpu0, wall0 = time.process_time(), time.perf_counter()
    time.sleep(args.steady)
    steady_cpu = (time.process_time() - cpu0) / (time.perf_counter() - wall0)
    deadline_end = fire_from + args.span + 5.0 - (time.perf_counter() - t0)
    time.sleep(max(0.0, deadline_end))
    rec.stop()
    engine.dispose()

    with lock:
        got = sorted(lags)
    p50 = statistics.median(got) if got else float("nan")
    p99 = got[min(len(got) - 1, int(len(got) * 0.99))] if got else float("nan")
    print(f"steady state: reconciler CPU {steady_cpu * 100:.2f} % of one core "
          f"over {args.steady:.0f} s (goal < 5 %)")  # fmt: skip
    print(f"fired {len(got)}/{args.firing}; lag p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms, "
          f"max {got[-1] * 1000 if got else float('nan'):.0f} ms (goal p99 <= 1000 ms)")  # fmt: skip
    ok = len(got) == args.firing and p99 <= 1.0 and steady_cpu < 0.05
    print(f"RESULT: {'MEETS' if ok else 'MISSES'} goals")


if __name__ == "__main__":
    main()
