"""The bodies of RunPod v2's pod routes (``CreatePodRequest``, ``UpdatePodRequest``,
``PodActionRequest``) and the answers' shapes for gpuyard's OpenAPI document.

The request models are strict, as their JSON Schema says (``"2"`` is not 2, ``"true"``
not true); rules the schema cannot state (the catalog's GPU types, the host port
range, env names...) are the use cases' and answer 400 naming the pod's field. A NUL
anywhere in a body is a 400 too, as on every surface.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gpuyard.core.errors import ValidationFailed
from gpuyard.core.input_rules import MAX_MOUNT_PATH_CHARS, MOUNT_PATH_PATTERN, NAME_PATTERN
from gpuyard.core.models import whole_floats_as_ints
from gpuyard.core.text import nul_path

PORT_PATTERN = r"^[0-9]{1,5}/(tcp|udp|http)$"
CUDA_PATTERN = r"^[0-9]{1,4}\.[0-9]{1,4}$"
MAX_TEXT = 8192
CudaVersion = Annotated[str, Field(max_length=16, pattern=CUDA_PATTERN)]
PortText = Annotated[str, Field(max_length=16, pattern=PORT_PATTERN)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _clean(cls, data: Any) -> Any:
        where = nul_path(data)
        if where is not None:
            # A 400 like every surface's, not a schema failure (the schema allows it).
            raise ValidationFailed(where or "body", "must not contain NUL (\\u0000) characters")
        return whole_floats_as_ints(cls, data)


def _path() -> Any:
    return Field(max_length=MAX_MOUNT_PATH_CHARS, pattern=MOUNT_PATH_PATTERN)


class PersistentMount(_Body):
    size: int = Field(ge=10, le=1_048_576, description="Volume size in GB")
    path: str = _path()


class NetworkMount(_Body):
    volumeId: str = Field(min_length=1, max_length=100, description="A network volume's id")
    path: str = _path()


class Mounts(_Body):
    persistent: PersistentMount | None = None
    network: list[NetworkMount] | None = Field(default=None, max_length=1)


class CreateGpu(_Body):
    id: str = Field(min_length=1, max_length=100, description="A GPU type of the catalog")
    count: int = Field(default=1, ge=1, le=64)
    minCudaVersion: str | None = Field(default=None, max_length=16, pattern=CUDA_PATTERN)
    allowedCudaVersions: list[CudaVersion] | None = Field(default=None, max_length=32)


class CreateCpu(_Body):
    id: str = Field(
        min_length=1, max_length=100, description="A CPU flavor: cpu3c (2 GB per vCPU), "
        "cpu3g (4 GB) or cpu3m (8 GB); others get 4 GB per vCPU",
    )  # fmt: skip
    vcpuCount: int = Field(ge=2, le=1024)


Command = list[str] | str


class CreatePodRequest(_Body):
    """RunPod's ``CreatePodRequest``, plus what its clients send beyond the document:
    ``interruptible``, ``bid``/``bidPerGpu`` (a spot pod at that bid per GPU-hour),
    ``entrypoint`` and ``cmd`` (a list, or one string split like a shell)."""

    name: str = Field(min_length=1, max_length=200, pattern=NAME_PATTERN)
    image: str | None = Field(default=None, min_length=1, max_length=512)
    args: str | None = Field(default=None, max_length=MAX_TEXT)
    disk: int | None = Field(default=None, ge=1, le=65536, description="Container disk, GB")
    env: dict[str, str] | None = Field(default=None, max_length=256)
    ports: list[PortText] | None = Field(default=None, max_length=64)
    registry: str | None = Field(
        default=None, max_length=20, description="A registry credential's id"
    )
    gpu: CreateGpu | None = None
    cpu: CreateCpu | None = None
    cloud: Literal["SECURE", "COMMUNITY"] = "SECURE"
    dataCenterIds: list[str] | None = Field(
        default=None, max_length=20, description="gpuyard locations, tried in order"
    )
    globalNetworking: bool = False
    mounts: Mounts | None = None
    startJupyter: bool = False
    startSsh: bool = False
    templateId: str | None = Field(default=None, min_length=1, max_length=20)
    interruptible: bool = False
    bid: float | None = Field(default=None, gt=0, le=1000)
    bidPerGpu: float | None = Field(default=None, gt=0, le=1000)
    entrypoint: Command | None = None
    cmd: Command | None = None


class UpdatePodRequest(_Body):
    """RunPod's ``UpdatePodRequest``: only the fields sent change."""

    name: str | None = Field(default=None, min_length=1, max_length=200, pattern=NAME_PATTERN)
    image: str | None = Field(default=None, min_length=1, max_length=512)
    args: str | None = Field(default=None, max_length=MAX_TEXT)
    disk: int | None = Field(default=None, ge=1, le=65536)
    env: dict[str, str] | None = Field(default=None, max_length=256)
    ports: list[PortText] | None = Field(default=None, max_length=64)
    registry: str | None = Field(default=None, max_length=20)
    mounts: Mounts | None = None
    locked: bool | None = None
    globalNetworking: bool | None = None
    templateId: str | None = Field(default=None, max_length=20)


class PodActionRequest(_Body):
    action: Literal["start", "stop", "restart", "terminate"]


# -- answers (OpenAPI only: the routes build their JSON in pod_views.py) --------------


class _Out(BaseModel):
    model_config = ConfigDict(extra="allow")


class GpuOut(_Out):
    id: str
    count: int


class CpuOut(_Out):
    id: str
    vcpuCount: int
    memory: int


class SshEndpoint(_Out):
    host: str
    port: int
    username: str
    command: str


class PodSsh(_Out):
    proxy: SshEndpoint | None
    direct: SshEndpoint | None


class RuntimePort(_Out):
    private: int
    public: int | None
    type: str
    ip: str | None


class PodRuntime(_Out):
    uptime: int
    ports: list[RuntimePort]


class GlobalNetworking(_Out):
    enabled: bool


class PersistentOut(_Out):
    size: int
    path: str


class NetworkOut(_Out):
    volumeId: str
    path: str


class MountsOut(_Out):
    persistent: PersistentOut | None = None
    network: list[NetworkOut] | None = None


class Pod(_Out):
    """RunPod's ``Pod`` (and gpuyard's ``interruptible``, ``bidPerGpu``)."""

    id: str
    name: str
    status: Literal["PROVISIONING", "STARTING", "RUNNING", "EXITED", "ERROR", "TERMINATED"]
    actions: list[Literal["start", "stop", "restart", "terminate"]]
    image: str
    args: str
    disk: int
    env: dict[str, str]
    ports: list[str]
    registry: str | None
    mounts: MountsOut
    gpu: GpuOut | None = None
    cpu: CpuOut | None = None
    cloud: Literal["SECURE", "COMMUNITY"]
    dataCenterId: str | None
    cudaVersion: str | None
    ssh: PodSsh
    template: str | None
    cost: float
    locked: bool
    globalNetworking: GlobalNetworking
    runtime: PodRuntime | None
    createdAt: str
    startedAt: str | None
    interruptible: bool
    bidPerGpu: float | None


class ListPodsResponse(_Out):
    pods: list[Pod]
    nextCursor: str | None = Field(
        default=None, description="With limit: the next page's cursor (null on the last)"
    )
