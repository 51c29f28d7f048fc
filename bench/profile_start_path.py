"""Diagnostic companion of bench_start_latency.py: the engine calls gpuyard's reconciler
makes for one create->running (ClusterDriver._start), timed one by one through
DockerEngineRuntime against a private podman service, next to a bare
``podman run -d``. Shows how much of gpuyard's start time is engine round trips and
how much is gpuyard's own bookkeeping (DB transactions, wake-up, HTTP).

    .venv/bin/python bench/profile_start_path.py [--runs 10]
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DEV_IMAGE, median

from gpuyard.core.ownership import Ownership
from gpuyard.runtimes.base import ContainerSpec, PortBinding
from gpuyard.runtimes.engines.devimage import build_dev_image
from gpuyard.runtimes.engines.runtime import DockerEngineRuntime
from gpuyard.runtimes.engines.url import PodmanService


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10)
    runs = ap.parse_args().runs
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

        for i in range(-1, runs):  # run -1 is a warm-up
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
        return 0
    finally:
        service.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
