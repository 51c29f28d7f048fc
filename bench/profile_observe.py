"""Profile of the reconciler's steady-state passes with 10,000 running clusters (not a
benchmark: it prints where the time goes, per piece, and a cProfile of the lot).

Seeds a SQLite store with bench/_seed_scale.py (``--live`` running clusters on the
local host, optionally ``--terminated`` history), gives them auto-termination
policies (bench_observe.set_policies), puts a running container for each on an
in-memory FakeRuntime and builds the real Reconciler on it. Then, in this thread,
times each piece of what the loop does at steady state (nothing changes between
passes): the dispatch pass with auto-termination, one engine observation, the volume
scan, the resting-GPU sweep, the heartbeat and the volume usage pass; and runs
``--passes`` of the whole under cProfile.

    .venv/bin/python bench/profile_observe.py [--live 10000] [--terminated 0] [--passes 5]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _scale_server import adopt_running
from _seed_scale import prepare_home, seed
from bench_observe import set_policies

from gpuyard.observability.metrics import StoreCollector
from gpuyard.reconciler.duties.drains import restart_drained
from gpuyard.reconciler.wiring import build_reconciler
from gpuyard.services.fleet.health import record_heartbeat
from gpuyard.testing.fake_runtime import FakeRuntime


def timed(label: str, fn: Callable[[], object], reps: int = 3) -> None:
    best = float("inf")
    for _ in range(reps):
        t0 = time.process_time()
        fn()
        best = min(best, time.process_time() - t0)
    print(f"  {label:<34} {best * 1000:8.1f} ms CPU (best of {reps})")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--live", type=int, default=10_000)
    ap.add_argument("--terminated", type=int, default=0)
    ap.add_argument("--passes", type=int, default=5)
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="gy-profile-observe-"))
    _, ctx = prepare_home(home, None, args.live)
    done = seed(ctx, terminated=args.terminated, intervals=args.terminated * 5, live=args.live)
    set_policies(ctx, done.live_ids)
    runtime = FakeRuntime()
    rec = build_reconciler(ctx, runtime)
    adopt_running(runtime, done.live_ids)
    print(f"{args.live} running clusters ({args.terminated} terminated) seeded "
          f"in {done.seconds:.1f} s")  # fmt: skip
    engines = rec.hosts.engines()
    key, host_ids = engines[0]
    rec.run_pass(observe=False)  # the first pass reads every policy once
    rec.queue.close(wait=True)  # nothing queued runs: each piece is timed alone

    collector = StoreCollector(ctx)
    scan_runtime = rec.hosts.runtime_of(host_ids)
    timed("dispatch + auto-termination pass", lambda: rec.run_pass(observe=False))
    timed("auto-termination with idle sample", lambda: rec.autoterm.run(sample=True))
    timed("observe_engine", lambda: rec.observe_engine(key, host_ids))
    timed("volume scan", lambda: rec.volume_scans.scan_engine(scan_runtime, host_ids))
    timed("resting-GPU sweep", rec.duties.resting_gpus.free)
    timed(
        "heartbeat",
        lambda: record_heartbeat(ctx, host_ids, None, misses_allowed=3),
    )

    def moves() -> None:
        restart_drained(ctx, host_ids)
        rec.driver.delete_old_copies(list(host_ids))

    timed("restart drained + old copies", moves)
    timed("volume usage", lambda: rec.volume_usage.run(scan_runtime, host_ids))
    timed("metrics scrape (StoreCollector)", lambda: list(collector.collect()))

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(args.passes):
        rec.run_pass(observe=False)
        rec.duties.resting_gpus.free()
        rec.observe_engine(key, host_ids)
        record_heartbeat(ctx, host_ids, None, misses_allowed=3)
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(args.top)
    print(out.getvalue())


if __name__ == "__main__":
    main()
