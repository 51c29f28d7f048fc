"""Launcher used by bench_get_cluster.py: the real gpuyard app (build_server) on the
in-memory FakeRuntime, under uvicorn, one worker, log level warning, SQLite in --home.

    python bench/_gpuyard_fake_server.py --home DIR --port PORT

The admin key is written to DIR/credentials by the server's first start, as usual.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import uvicorn

from gpuyard.api.app import build_server
from gpuyard.settings import Settings
from gpuyard.testing.fake_runtime import FakeRuntime


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--home", type=Path, required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument(
        "--threads",
        type=int,
        default=0,
        help="diagnostics: anyio threadpool size (default: library default, 40)",
    )
    ap.add_argument(
        "--switch-interval",
        type=float,
        default=0.0,
        help="diagnostics: sys.setswitchinterval seconds (default: Python's 0.005)",
    )
    ap.add_argument(
        "--default-rate-limits",
        action="store_true",
        help="keep the shipped rate limits (bench_hostile.py measures them)",
    )
    args = ap.parse_args()
    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval)
    # The load generator is one key from one address, far past the default limits:
    # the limiter stays on (its cost is in the figures) with limits it never reaches.
    limits: dict[str, Any] = (
        {}
        if args.default_rate_limits
        else {"rate_limit_per_key": 1e9, "rate_limit_per_source": 1e9}
    )
    settings = Settings(
        home=args.home,
        port=args.port,
        local_gpus="NVIDIA RTX A6000:8",
        local_vcpus=64,
        local_memory_gb=512,
        local_disk_gb=2000,
        **limits,
    )
    server = build_server(settings, FakeRuntime())
    app = server.app
    if args.threads:
        inner = app.router.lifespan_context

        @asynccontextmanager
        async def lifespan(a: Any) -> AsyncIterator[Any]:
            anyio.to_thread.current_default_thread_limiter().total_tokens = args.threads
            async with inner(a) as state:
                yield state

        app.router.lifespan_context = lifespan
    uvicorn.run(app, host="127.0.0.1", port=args.port, workers=1, log_level="warning")


if __name__ == "__main__":
    main()
