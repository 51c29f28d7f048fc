"""OpenAPI models of ``GET /v1/hosts``. Like api/schemas.py, unknown fields are
forbidden and the API tests validate real answers against them."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from gpuyard.api.schemas import Meta


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EngineReach(_Out):
    reachable: bool
    # Why the engine cannot be reached (what to install or start); null when it can.
    message: str | None


class HostGpuOut(_Out):
    index: int
    type: str
    uuid: str | None
    allocated: bool


class FreeResources(_Out):
    host_id: int
    # Free GPUs by type.
    gpus: dict[str, int]
    vcpus: float
    memory_gb: float
    disk_gb: float


class HostOut(_Out):
    id: int
    name: str
    # The machine's stable id (GPUYARD_HOME/host-id, first derived from
    # /etc/machine-id): a renamed machine keeps its row. Null for a row no server has
    # claimed since host ids were introduced.
    machine_id: str | None
    location: str
    cloud_type: str
    address: str
    engine_url: str | None
    engine: EngineReach
    healthy: bool
    vcpus: int
    memory_gb: int
    disk_gb: int
    gpu_source: Literal["nvml", "declared"]
    declared: list[str]
    # False when the engine cannot apply CPU and memory limits to containers;
    # ``limits_note`` says why.
    enforces_limits: bool
    limits_note: str | None
    gpus: list[HostGpuOut]
    free: FreeResources


class HostList(_Out):
    # This installation's UUID: every engine object gpuyard makes carries it as the
    # ``gpuyard.installation`` label.
    installation_id: str
    hosts: list[HostOut]


class HostListEnvelope(_Out):
    success: Literal[True]
    data: HostList
    meta: Meta
