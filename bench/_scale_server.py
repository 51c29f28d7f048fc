"""Launcher used by bench_scale.py: the real gpuyard app (build_server) on the in-memory
FakeRuntime, under uvicorn (one worker, log level warning), on a store that
bench/_seed_scale.py filled.

    python bench/_scale_server.py --home DIR --port PORT [--database-url URL]
        [--live N] [--running-file FILE]

``--running-file`` names the clusters (one id a line) the fake engine lists as running
containers of this installation when the server starts, as a real engine would after
a restart of gpuyard alone. ``--live`` sizes the local host as the seeder did.

The reconciler logs at INFO with epoch timestamps, so the caller can read when the
first full reconcile pass completed (``first full reconcile pass completed``).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import uvicorn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _seed_scale import IMAGE, scale_settings

from gpuyard.api.app import build_server
from gpuyard.runtimes.base import ContainerSpec, ContainerState
from gpuyard.testing.fake_runtime import FakeContainer, FakeRuntime

FIRST_FULL_PASS = "first full reconcile pass completed"


def adopt_running(runtime: FakeRuntime, ids: list[str]) -> None:
    """Put a running container of ours on the fake engine for each of ``ids``."""
    owner = runtime.owner
    assert owner is not None, "bind the runtime (build_server) first"
    for n, cid in enumerate(ids):
        spec = ContainerSpec(cluster_id=cid, image=IMAGE, command=None, env={}, ports=(),
                             volume_name=owner.volume(cid), volume_mount_path="/workspace",
                             cpu_cores=1, memory_gb=1, gpu_indices=(n,))  # fmt: skip
        runtime.containers[cid] = FakeContainer(
            id=f"fake{n:060d}", spec=spec, state=ContainerState.RUNNING,
            started_at="2024-01-01T00:00:00Z", owner=owner.installation_id,
        )  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--home", type=Path, required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--database-url", default=None)
    ap.add_argument("--live", type=int, default=1000)
    ap.add_argument("--running-file", type=Path, default=None)
    args = ap.parse_args()
    logging.basicConfig(format="%(created).6f %(name)s %(levelname)s %(message)s")
    for name in ("gpuyard.reconciler.loop", "gpuyard.reconciler.duties.engine_checks"):
        logging.getLogger(name).setLevel(logging.INFO)
    settings = scale_settings(args.home, args.database_url, args.live, port=args.port)
    runtime = FakeRuntime()
    server = build_server(settings, runtime)
    if args.running_file is not None:
        adopt_running(runtime, args.running_file.read_text().split())
    uvicorn.run(server.app, host="127.0.0.1", port=args.port, workers=1, log_level="warning")


if __name__ == "__main__":
    main()
