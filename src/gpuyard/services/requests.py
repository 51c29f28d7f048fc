"""Validated inputs of the cluster use cases; the REST API uses them as bodies."""

from __future__ import annotations

from typing import Annotated, Any, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    PrivateAttr,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from gpuyard.core.models import AutoTerminatePolicy, CloudType, PortSpec, validate_env
from gpuyard.core.secret_env import env_map_json_schema, split_marks
from gpuyard.core.text import refuse_nul

# Integer ids are 32-bit in the store (PostgreSQL INTEGER).
MAX_ID = 2**31 - 1


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _no_nul(cls, data: Any) -> Any:
        return refuse_nul(data)


class CreateCluster(_Body):
    name: str = Field(default="", max_length=200)
    project_id: int | None = Field(default=None, ge=1, le=MAX_ID)
    gpu_type: str | None = None
    gpu_count: int | None = Field(default=None, ge=0, le=64)
    cpu_cores: int = Field(default=2, ge=1, le=1024)
    memory_gb: int = Field(default=4, ge=1, le=16384)
    container_disk_gb: int = Field(default=10, ge=1, le=65536)
    volume_gb: int = Field(default=0, ge=0, le=1048576)
    volume_mount_path: str = Field(default="/workspace", max_length=512)
    docker_image: str = Field(min_length=1, max_length=512)
    docker_args: str = Field(default="", max_length=8192)
    # A value may be {"value": ..., "secret": true}: see _secret_marks.
    env: Annotated[dict[str, str], WithJsonSchema(env_map_json_schema())] = Field(
        default_factory=dict
    )
    ports: list[PortSpec] = Field(default_factory=list, max_length=64)
    cloud_type: CloudType = CloudType.SECURE
    auto_terminate: AutoTerminatePolicy | None = None
    # Spot: a bid per GPU-hour at or above the GPU type's spot floor; the cluster may
    # be preempted (stopped, volume kept) by on-demand requests or higher bids.
    interruptible: bool = False
    bid_per_gpu: float | None = Field(default=None, gt=0, le=1000)

    # Names the body marked ``secret: true`` (core/secret_env.py).
    _secret_env: frozenset[str] = PrivateAttr(default=frozenset())

    @property
    def spot(self) -> bool:
        return self.interruptible or self.bid_per_gpu is not None

    @property
    def secret_env(self) -> frozenset[str]:
        return self._secret_env

    @model_validator(mode="wrap")
    @classmethod
    def _secret_marks(cls, data: Any, handler: ModelWrapValidatorHandler[Self]) -> Self:
        # Marked values become plain strings before validation, so every env rule sees
        # strings; the marks are kept beside them.
        marked: frozenset[str] = frozenset()
        if isinstance(data, dict) and "env" in data:
            env, marked = split_marks(data["env"])
            data = {**data, "env": env}
        body = handler(data)
        if marked:
            body._secret_env = marked
        return body

    @field_validator("env")
    @classmethod
    def _env(cls, env: dict[str, str]) -> dict[str, str]:
        return validate_env(env)

    @field_validator("volume_mount_path")
    @classmethod
    def _mount(cls, path: str) -> str:
        if not path.startswith("/") or ".." in path.split("/") or path == "/":
            raise ValueError("must be an absolute path (not '/') without '..'")
        return path


class ConfigurationUpdate(_Body):
    cpu_cores: int | None = Field(default=None, ge=1, le=1024)
    memory_gb: int | None = Field(default=None, ge=1, le=16384)
    storage_gb: int | None = Field(default=None, ge=0, le=1048576)
    docker_image: str | None = Field(default=None, min_length=1, max_length=512)
    gpu_count: int | None = Field(default=None, ge=0, le=64)


class AutoTerminateUpdate(_Body):
    enabled: bool | None = None
    idle_minutes: float | None = Field(default=None, gt=0, le=525600)
    cost_limit_usd: float | None = Field(default=None, gt=0)
    max_runtime_hours: float | None = Field(default=None, gt=0, le=8760)
    action: str | None = Field(default=None, pattern="^(stop|terminate)$")


class StartCluster(_Body):
    wait_for_ready: bool = False
    timeout_minutes: int = Field(default=10, ge=1, le=30)
    update_configuration: ConfigurationUpdate | None = None
    restore_from_snapshot: str | None = Field(default=None, max_length=100)
    # A null value removes the variable; a value may be {"value": ..., "secret": true}.
    environment_updates: Annotated[
        dict[str, str | None] | None, WithJsonSchema(env_map_json_schema(nullable=True))
    ] = None
    port_mapping_updates: list[PortSpec] | None = Field(default=None, max_length=64)
    auto_terminate_updates: AutoTerminateUpdate | None = None

    # Names the body marked ``secret: true`` (core/secret_env.py).
    _secret_env: frozenset[str] = PrivateAttr(default=frozenset())

    @property
    def secret_env(self) -> frozenset[str]:
        return self._secret_env

    @model_validator(mode="wrap")
    @classmethod
    def _secret_marks(cls, data: Any, handler: ModelWrapValidatorHandler[Self]) -> Self:
        marked: frozenset[str] = frozenset()
        if isinstance(data, dict) and "environment_updates" in data:
            env, marked = split_marks(data["environment_updates"], nullable=True)
            data = {**data, "environment_updates": env}
        body = handler(data)
        if marked:
            body._secret_env = marked
        return body

    @field_validator("environment_updates")
    @classmethod
    def _env(cls, env: dict[str, str | None] | None) -> dict[str, str | None] | None:
        if env:
            validate_env({k: v or "" for k, v in env.items()})
        return env


class BidResume(_Body):
    bid_per_gpu: float = Field(gt=0, le=1000)
    gpu_count: int | None = Field(default=None, ge=1, le=64)
