"""Small helpers shared by the benchmark scripts (not a benchmark itself)."""

from __future__ import annotations

import json
import math
import os
import socket
import sqlite3
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

from gpuyard.runtimes.engines.url import terminate_process

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
DEV_IMAGE = "localhost/gpuyard/busybox:latest"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100) of a non-empty sequence."""
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def wait_http_ok(
    url: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 120
) -> None:
    # 120 s: on a shared machine whose CPUs are saturated, a server's imports alone
    # have taken over 25 s.
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: process exited ({proc.returncode}):\n" + tail(log))
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{url} did not come up:\n" + tail(log))


def start_server(
    home: Path, port: int, env: dict[str, str], log: Path
) -> tuple[subprocess.Popen[bytes], str, str]:
    """``python -m gpuyard serve`` with ``env`` (GPUYARD_HOME=home, port set by the
    caller), output appended to ``log``; once /healthz answers: (process, base URL,
    the admin key its first start wrote)."""
    home.mkdir(parents=True)
    with log.open("ab") as out:
        server = subprocess.Popen([sys.executable, "-m", "gpuyard", "serve"], env=env,
                                  stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    wait_http_ok(base + "/healthz", server, log)
    return server, base, json.loads((home / "credentials").read_text())["api_key"]


def tail(path: Path, n: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return "(no log)"


def stop_process(proc: subprocess.Popen[bytes] | None, timeout_s: float = 20) -> None:
    if proc is not None:
        terminate_process(proc, timeout_s)


def cpu_seconds(pid: int) -> float:
    """User+system CPU seconds used so far by ``pid`` (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


def installation_label(home: Path) -> str | None:
    """``gpuyard.installation=<uuid>`` of the server whose GPUYARD_HOME is ``home`` (its
    engine objects carry it), or None when its database does not exist yet."""
    db = home / "gpuyard.db"
    if not db.exists():
        return None
    with sqlite3.connect(db) as conn:
        row = conn.execute("SELECT uuid FROM installation LIMIT 1").fetchone()
    return f"gpuyard.installation={row[0]}" if row else None
