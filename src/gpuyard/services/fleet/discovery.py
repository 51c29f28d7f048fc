"""What the local machine has: vCPUs, memory, disk and GPUs (nvidia-ml-py), each
overridable by a declared value from settings."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from gpuyard.core.errors import ValidationFailed
from gpuyard.core.models import GpuSource, HostGpu
from gpuyard.core.placement import cuda_from_nvml


@dataclass(frozen=True)
class LocalInventory:
    vcpus: int
    memory_gb: int
    disk_gb: int
    gpus: tuple[HostGpu, ...]
    gpu_source: GpuSource
    declared: tuple[str, ...]
    # The CUDA driver version (NVML's, else the declared one); None: unknown.
    cuda_version: str | None = None


def parse_declared_gpus(spec: str) -> tuple[HostGpu, ...]:
    """``"NVIDIA RTX A6000:4,NVIDIA GeForce RTX 4090:2"`` -> indices 0..5 in that order."""
    gpus: list[HostGpu] = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, sep, count = part.rpartition(":")
        if not sep or not name.strip() or not count.strip().isdigit():
            raise ValidationFailed("GPUYARD_LOCAL_GPUS", f"expected 'TYPE:COUNT', got {part!r}")
        for _ in range(int(count)):
            gpus.append(HostGpu(index=len(gpus), gpu_type=name.strip()))
    return tuple(gpus)


def discover_nvml_gpus() -> tuple[HostGpu, ...]:
    """GPUs nvidia-ml-py can see; empty when there is no driver."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no driver, no library: simply no GPUs visible
        return ()
    try:
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(handle)
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            gpus.append(
                HostGpu(
                    index=i,
                    gpu_type=name.decode() if isinstance(name, bytes) else str(name),
                    uuid=uuid.decode() if isinstance(uuid, bytes) else str(uuid),
                )
            )
        return tuple(gpus)
    finally:
        pynvml.nvmlShutdown()


def discover_nvml_cuda() -> str | None:
    """The CUDA driver version NVML reports ("12.4"); None when there is no driver."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no driver, no library: no version to tell
        return None
    try:
        return cuda_from_nvml(int(pynvml.nvmlSystemGetCudaDriverVersion()))
    except Exception:  # an old driver without the call
        return None
    finally:
        pynvml.nvmlShutdown()


def _memory_gb() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // (1024 * 1024)
    except OSError:
        pass
    return 1


def discover(
    *,
    declared_gpus: str | None,
    vcpus: int | None,
    memory_gb: int | None,
    disk_gb: int | None,
    disk_path: Path,
    cuda_version: str | None = None,
) -> LocalInventory:
    """What the machine has, the declared figures winning. The CUDA driver version is
    NVML's where it sees GPUs, else ``cuda_version`` (the operator's word)."""
    declared: list[str] = []
    if declared_gpus is not None:
        gpus, source = parse_declared_gpus(declared_gpus), GpuSource.DECLARED
    else:
        gpus, source = discover_nvml_gpus(), GpuSource.NVML
    if vcpus is not None:
        declared.append("vcpus")
    if memory_gb is not None:
        declared.append("memory_gb")
    if disk_gb is not None:
        declared.append("disk_gb")
    disk_path.mkdir(parents=True, exist_ok=True)
    return LocalInventory(
        vcpus=vcpus if vcpus is not None else (os.cpu_count() or 1),
        memory_gb=memory_gb if memory_gb is not None else _memory_gb(),
        disk_gb=disk_gb if disk_gb is not None else shutil.disk_usage(disk_path).total // 2**30,
        gpus=gpus,
        gpu_source=source,
        declared=tuple(declared),
        cuda_version=(discover_nvml_cuda() if source is GpuSource.NVML else None) or cuda_version,
    )
