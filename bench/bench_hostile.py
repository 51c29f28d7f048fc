"""What one hostile tenant can do to everyone else's latency, measured against the same
server left alone in the same run.

The real app (bench/_gpuyard_fake_server.py: build_server on the in-memory FakeRuntime,
SQLite, uvicorn, one worker) with its shipped limits:

1. ``/healthz`` latency, one client in a closed loop: alone (baseline), then while four
   processes each post 10 MB JSON arrays to ``/v1/projects`` as fast as they are answered
   (the body limit answers 413 before reading them; past the key's rate limit, 429). Printed: p50/p99 under the flood
   and their ratio to the baseline, the server's RSS growth, how the floods were answered.
2. Key guessing: 500 requests with random keys from one address. Printed: how many were
   refused 401 (a guess checked) and 429 (throttled before being checked).

    .venv/bin/python bench/bench_hostile.py [--seconds 8]
"""

from __future__ import annotations

import argparse
import collections
import json
import multiprocessing
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import BENCH_DIR, free_port, percentile, stop_process, wait_http_ok

FLOOD_BYTES = 10 * 1024 * 1024
FLOODERS = 4


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def healthz_latencies(base: str, seconds: float) -> list[float]:
    out: list[float] = []
    deadline = time.monotonic() + seconds
    with httpx.Client(base_url=base, timeout=30) as c:
        while time.monotonic() < deadline:
            t0 = time.perf_counter()
            c.get("/healthz")
            out.append(time.perf_counter() - t0)
    return out


def flood(port: int, key: str, stop: Event, results: Queue[dict[str, int]]) -> None:
    """Post a 10 MB array over a raw socket, again and again, sending the whole body
    as an attacker would (the server may answer and close before it is all sent). Runs
    in its own process, so the measuring client keeps its own interpreter; puts how the
    posts were answered on ``results`` at the end."""
    answers: collections.Counter[str] = collections.Counter()
    chunk = b"[" + b"1," * (64 * 1024)
    head = (
        f"POST /v1/projects HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {FLOOD_BYTES}\r\n\r\n"
    ).encode()
    while not stop.is_set():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
                s.sendall(head)
                sent = 0
                while sent < FLOOD_BYTES and not stop.is_set():
                    piece = chunk[: FLOOD_BYTES - sent]
                    s.sendall(piece)
                    sent += len(piece)
                status = s.recv(64).split(b" ")[1].decode() if sent else "?"
                answers[status] += 1
        except OSError:
            answers["closed early"] += 1
    results.put(dict(answers))


def key_guessing(base: str, n: int = 500) -> collections.Counter[int]:
    got: collections.Counter[int] = collections.Counter()
    with httpx.Client(base_url=base, timeout=30) as c:
        for _ in range(n):
            r = c.get(
                "/v1/clusters", headers={"Authorization": f"Bearer gy_{secrets.token_urlsafe(24)}"}
            )
            got[r.status_code] += 1
    return got


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=8.0)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gy-bench-hostile-"))
    port = free_port()
    log = work / "server.log"
    proc = None
    try:
        with log.open("ab") as out:
            proc = subprocess.Popen(
                [sys.executable, str(BENCH_DIR / "_gpuyard_fake_server.py"), "--home", str(work / "home"),
                 "--port", str(port), "--default-rate-limits"],
                stdout=out, stderr=subprocess.STDOUT, env={**os.environ},
            )  # fmt: skip
        base = f"http://127.0.0.1:{port}"
        wait_http_ok(base + "/healthz", proc, log)
        key = json.loads((work / "home" / "credentials").read_text())["api_key"]
        alone = healthz_latencies(base, args.seconds)
        rss0 = rss_kb(proc.pid)
        stop: Event = multiprocessing.Event()
        results: Queue[dict[str, int]] = multiprocessing.Queue()
        flooders = [
            multiprocessing.Process(target=flood, args=(port, key, stop, results))
            for _ in range(FLOODERS)
        ]
        for f in flooders:
            f.start()
        time.sleep(0.5)
        loaded = healthz_latencies(base, args.seconds)
        rss1 = rss_kb(proc.pid)
        stop.set()
        answers: collections.Counter[str] = collections.Counter()
        for _ in flooders:
            answers.update(results.get(timeout=60))
        for f in flooders:
            f.join()
        guesses = key_guessing(base)

        p50a, p99a = percentile(alone, 50), percentile(alone, 99)
        p50b, p99b = percentile(loaded, 50), percentile(loaded, 99)
        print(
            f"/healthz alone:           p50 {p50a * 1000:.1f} ms  p99 {p99a * 1000:.1f} ms  ({len(alone)} requests)"
        )
        print(
            f"/healthz under {FLOODERS}x10 MB flood: p50 {p50b * 1000:.1f} ms  p99 {p99b * 1000:.1f} ms  ({len(loaded)} requests)"
        )
        print(f"ratio under flood / alone: p50 {p50b / p50a:.2f}x  p99 {p99b / p99a:.2f}x")
        print(f"server RSS during the flood: {rss0 / 1024:.0f} MB -> {rss1 / 1024:.0f} MB")
        print(f"flood answers: {dict(answers)}")
        print(f"500 random-key guesses from one address: {dict(sorted(guesses.items()))}")
    finally:
        stop_process(proc)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
