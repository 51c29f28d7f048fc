"""Fallback HTTP load generator for bench_get_cluster.py (used when ``wrk`` is missing,
or with ``--client python``): raw asyncio streams, HTTP/1.1 keep-alive, N connections
each sending one request at a time (closed loop, like wrk).

    python bench/_loadgen.py --url http://127.0.0.1:PORT/path --connections 32 \
        --warmup 2 --duration 8 [--header "Authorization: Bearer KEY"]

Prints one JSON line: requests, errors (non-2xx), seconds, rps, p50_ms, p99_ms.
Raw sockets rather than httpx: httpx's per-request overhead (~100-200 us of Python)
would make the client, not the server, the bottleneck for the bare endpoint.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import time
from urllib.parse import urlsplit


async def worker(
    host: str,
    port: int,
    request: bytes,
    stop_at: list[float],
    measure_from: float,
    lat: list[float],
    counts: list[int],
) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        while True:
            t0 = time.perf_counter()
            if t0 >= stop_at[0]:
                return
            writer.write(request)
            status_line = await reader.readline()
            length = 0
            while True:
                line = await reader.readline()
                if line in (b"\r\n", b""):
                    break
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if length:
                await reader.readexactly(length)
            t1 = time.perf_counter()
            if t0 >= measure_from:
                lat.append(t1 - t0)
                if not status_line.split(b" ")[1].startswith(b"2"):
                    counts[1] += 1
                counts[0] += 1
    finally:
        writer.close()


def pct(ordered: list[float], p: float) -> float:
    return ordered[max(1, math.ceil(p / 100 * len(ordered))) - 1]


async def main_async(args: argparse.Namespace) -> dict[str, float]:
    u = urlsplit(args.url)
    host, port = u.hostname or "127.0.0.1", u.port or 80
    path = u.path + (f"?{u.query}" if u.query else "")
    headers = [f"GET {path} HTTP/1.1", f"Host: {host}:{port}", "Connection: keep-alive"]
    headers += args.header
    request = ("\r\n".join(headers) + "\r\n\r\n").encode()
    start = time.perf_counter()
    measure_from = start + args.warmup
    stop_at = [measure_from + args.duration]
    lat: list[float] = []
    counts = [0, 0]
    await asyncio.gather(
        *(
            worker(host, port, request, stop_at, measure_from, lat, counts)
            for _ in range(args.connections)
        )
    )
    seconds = args.duration
    lat.sort()
    return {
        "requests": counts[0],
        "errors": counts[1],
        "seconds": seconds,
        "rps": counts[0] / seconds,
        "p50_ms": pct(lat, 50) * 1000 if lat else float("nan"),
        "p99_ms": pct(lat, 99) * 1000 if lat else float("nan"),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--connections", type=int, default=32)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--duration", type=float, default=8.0)
    ap.add_argument("--header", action="append", default=[])
    args = ap.parse_args()
    try:
        import uvloop  # type: ignore[import-not-found,unused-ignore]

        uvloop.install()
    except ImportError:
        pass
    print(json.dumps(asyncio.run(main_async(args))))


if __name__ == "__main__":
    main()
