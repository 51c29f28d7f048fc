"""What a host has, asked of its engine (and, for disk and GPUs, of the host itself over
the command runner that reaches it): CPUs, memory, disk, GPUs, engine name and
version. Nothing is installed on the host; ``nvidia-smi`` is used where it exists."""

from __future__ import annotations

import re
from typing import Any

from gpuyard.core.errors import RuntimeFailure
from gpuyard.core.models import HostGpu
from gpuyard.runtimes.engines.engine import Engine
from gpuyard.runtimes.hosts.firewall import Runner
from gpuyard.runtimes.records import EngineInventory

GIB = 1024**3


def discover_inventory(engine: Engine, runner: Runner | None) -> EngineInventory:
    """Ask ``engine`` (and ``runner``, when given) what the host has. Raises
    RuntimeFailure when the engine does not answer."""
    with engine.errors("reading the engine's inventory"):
        info: dict[str, Any] = engine.client().info()
        version: dict[str, Any] = engine.client().version()
    components = version.get("Components") or []
    podman = any("podman" in str(c.get("Name", "")).lower() for c in components)
    name = "podman" if podman else "docker"
    engine_version = next(
        (str(c.get("Version")) for c in components if "podman" in str(c.get("Name", "")).lower()),
        str(version.get("Version") or "unknown"),
    )
    vcpus = int(info["NCPU"]) if info.get("NCPU") else None
    memory_gb = int(info["MemTotal"]) // GIB if info.get("MemTotal") else None
    disk_gb = gpus = cuda = None
    if runner is not None:
        root = str(info.get("DockerRootDir") or "/var/lib")
        disk_gb = _disk_gb(runner, root)
        gpus = _gpus(runner)
        cuda = _cuda_version(runner) if gpus else None
    return EngineInventory(name, engine_version[:100], vcpus, memory_gb, disk_gb, gpus, cuda)


def _disk_gb(runner: Runner, path: str) -> int | None:
    done = runner(["df", "-B1", "--output=size", path])
    lines = done.output.split()
    if done.returncode != 0 or not lines or not lines[-1].isdigit():
        return None
    return int(lines[-1]) // GIB


def _gpus(runner: Runner) -> tuple[HostGpu, ...]:
    """GPUs ``nvidia-smi`` lists on the host; none when it is missing or finds none."""
    done = runner(
        ["sh", "-c", "command -v nvidia-smi >/dev/null || exit 0; "
         "nvidia-smi --query-gpu=index,name,uuid --format=csv,noheader"]
    )  # fmt: skip
    if done.returncode == 255:
        raise RuntimeFailure(f"cannot ask the host for its GPUs: {done.output.strip()[:200]}")
    if done.returncode != 0:
        return ()
    return parse_nvidia_smi(done.output)


def _cuda_version(runner: Runner) -> str | None:
    """The CUDA driver version ``nvidia-smi -q`` reports; None when it does not."""
    done = runner(["nvidia-smi", "-q"])
    return parse_cuda_version(done.output) if done.returncode == 0 else None


_CUDA_LINE = re.compile(r"^\s*CUDA Version\s*:\s*(\d+(?:\.\d+)?)\s*$", re.MULTILINE)


def parse_cuda_version(output: str) -> str | None:
    """``CUDA Version : 12.4`` in ``nvidia-smi -q`` output as ``"12.4"``."""
    found = _CUDA_LINE.search(output)
    return found.group(1) if found else None


def parse_nvidia_smi(output: str) -> tuple[HostGpu, ...]:
    """``index, name, uuid`` lines of ``nvidia-smi --format=csv,noheader``."""
    gpus = []
    for line in output.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and parts[0].isdigit() and parts[1]:
            gpus.append(HostGpu(index=int(parts[0]), gpu_type=parts[1], uuid=parts[2] or None))
    return tuple(gpus)
