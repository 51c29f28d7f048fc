"""Observe and auto-termination passes at steady state: the server's CPU with 10,000
running clusters on one host (fake engine), against the same server with none.

Two stores are seeded with bench/_seed_scale.py (SQLite): ``busy`` holds ``--live``
running clusters on the local host (GPU, reservation, open intervals, as a start
leaves them; optionally ``--terminated`` history), each with an auto-termination
policy (``set_policies``: a third max runtime 48 h, a third cost limit, a third idle
for 2 h, so idleness is sampled; none is due during the run); ``idle`` is the same
installation with no cluster. Each is served by bench/_scale_server.py (the real app
under uvicorn, the fake engine listing a running container for each live cluster),
with every reconciler setting at its default: passes every 2 s, heartbeat and
observation every 5 s, volume scan every 30 s, volume usage every 60 s, idle samples
every 15 s.

Once the server has logged its first full reconcile pass, ``--settle`` seconds pass
(the first auto-termination pass reads every policy once), then the server process's
CPU time (user + system, /proc) is read over ``--seconds``. The servers take turns,
``--rounds`` each. Nothing calls the API meanwhile, so the difference between the two
is what the reconciler spends on 10,000 clusters. Goal: busy - idle < 5 % of one core.

    .venv/bin/python bench/bench_observe.py [--live 10000] [--terminated 0] [--seconds 60]
        [--rounds 1] [--settle 10]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import update

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import BENCH_DIR, cpu_seconds, free_port, median, stop_process, tail
from _scale_server import FIRST_FULL_PASS
from _seed_scale import prepare_home, seed, write_running

from gpuyard.services.context import Context
from gpuyard.store.schema import Cluster

GOAL = 0.05
# One policy of each kind, in turn: none is due within a run of the benchmark.
POLICIES: tuple[dict[str, Any], ...] = (
    {"enabled": True, "max_runtime_hours": 48.0},
    {"enabled": True, "cost_limit_usd": 100_000.0, "action": "terminate"},
    {"enabled": True, "idle_minutes": 120},
)


def set_policies(ctx: Context, ids: Sequence[str]) -> None:
    """Give each of ``ids`` one of ``POLICIES`` in turn (straight into the rows)."""
    rows = [{"id": cid, "auto_terminate": POLICIES[i % len(POLICIES)]} for i, cid in enumerate(ids)]
    with ctx.transaction() as session:
        session.execute(update(Cluster), rows)


@dataclass
class Store:
    label: str
    home: Path
    live: int
    running: Path


def make_store(label: str, work: Path, live: int, size: int, terminated: int) -> Store:
    """A seeded home whose host is sized for ``size`` clusters, ``live`` of them running."""
    home = work / label
    _, ctx = prepare_home(home, None, size)
    ids: list[str] = []
    if live or terminated:
        done = seed(ctx, terminated=terminated, intervals=terminated * 5, live=live)
        ids = done.live_ids
        set_policies(ctx, ids)
    ctx.sessions.kw["bind"].dispose()
    running = work / f"{label}.running"
    write_running(running, ids)
    print(f"  {label}: {live} running clusters with policies, {terminated} terminated")
    return Store(label, home, size, running)


def wait_full_pass(log: Path, proc: subprocess.Popen[bytes], timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited ({proc.returncode}):\n{tail(log)}")
        if FIRST_FULL_PASS in log.read_text(errors="replace"):
            return
        time.sleep(0.2)
    raise RuntimeError(f"no full reconcile pass:\n{tail(log)}")


def measure(store: Store, work: Path, seconds: float, settle: float) -> float:
    """The server's CPU share of one core over ``seconds`` of steady state."""
    log = work / f"{store.label}.log"
    cmd = [sys.executable, str(BENCH_DIR / "_scale_server.py"), "--home", str(store.home),
           "--port", str(free_port()), "--live", str(store.live),
           "--running-file", str(store.running)]  # fmt: skip
    with log.open("ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_full_pass(log, proc)
        time.sleep(settle)
        cpu0, wall0 = cpu_seconds(proc.pid), time.perf_counter()
        time.sleep(seconds)
        if proc.poll() is not None:
            raise RuntimeError(f"server exited ({proc.returncode}):\n{tail(log)}")
        return (cpu_seconds(proc.pid) - cpu0) / (time.perf_counter() - wall0)
    finally:
        stop_process(proc)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--live", type=int, default=10_000)
    ap.add_argument("--terminated", type=int, default=0)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--settle", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gy-bench-observe-"))
    try:
        print(f"seeding (cpus={os.cpu_count()}):")
        busy = make_store("busy", work, args.live, args.live, args.terminated)
        idle = make_store("idle", work, 0, args.live, 0)
        shares: dict[str, list[float]] = {"idle": [], "busy": []}
        for r in range(args.rounds):
            order = (idle, busy) if r % 2 == 0 else (busy, idle)
            for store in order:
                share = measure(store, work, args.seconds, args.settle)
                shares[store.label].append(share)
                print(f"  round {r + 1} {store.label:<5} server CPU {share * 100:6.2f} % of one "
                      f"core over {args.seconds:.0f} s")  # fmt: skip
        idle_share, busy_share = median(shares["idle"]), median(shares["busy"])
        extra = busy_share - idle_share
        print(f"{'server':<32} {'CPU % of one core':>18}")
        print(f"{'no clusters (baseline)':<32} {idle_share * 100:>18.2f}")
        print(f"{f'{args.live} running, policies on':<32} {busy_share * 100:>18.2f}")
        verdict = "MEETS" if extra < GOAL else "MISSES"
        print(f"RATIO: {args.live} running clusters cost {extra * 100:.2f} % of one core over the "
              f"idle server ({busy_share * 100:.2f} % vs {idle_share * 100:.2f} %); "
              f"goal < {GOAL * 100:.0f} %: {verdict}")  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
