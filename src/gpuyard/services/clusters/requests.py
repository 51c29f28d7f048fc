"""Validated inputs of the cluster use cases; the REST API uses them as bodies."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Self

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

from gpuyard.core.input_rules import (
    CUDA_VERSION_PATTERN,
    MAX_DB_ID,
    MAX_ENTRYPOINT_CHARS,
    MAX_ENTRYPOINT_ITEMS,
    MAX_MOUNT_PATH_CHARS,
    MOUNT_PATH_PATTERN,
    NAME_PATTERN,
    check_entrypoint,
    check_env_limits,
    check_mount_path,
    check_name,
)
from gpuyard.core.models import (
    AutoTerminateAction,
    AutoTerminatePolicy,
    CloudType,
    CostLimitUsd,
    IdleMinutes,
    MaxRuntimeHours,
    PortSpec,
    TrainingAutoTerminateAction,
    validate_env,
    whole_floats_as_ints,
)
from gpuyard.core.secret_env import env_map_json_schema, split_marks
from gpuyard.core.text import refuse_nul

# Integer ids are 32-bit in the store (PostgreSQL INTEGER).
MAX_ID = MAX_DB_ID


def check_port_labels(ports: list[PortSpec]) -> list[PortSpec]:
    """``ports`` unchanged, or ValueError when a description is not a clean label."""
    for i, port in enumerate(ports):
        try:
            check_name(port.description)
        except ValueError as exc:
            raise ValueError(f"[{i}].description {exc}") from None
    return ports


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _no_nul(cls, data: Any) -> Any:
        return whole_floats_as_ints(cls, refuse_nul(data))


class _MarksSecrets(_Body):
    """A body with an env map whose values may be marked ``{"value": ..., "secret":
    true}`` (core/secret_env.py). Marked values become plain strings before validation,
    so every env rule sees strings; the marked names are kept in :attr:`secret_env`."""

    _marks_field: ClassVar[str]
    # Whether the map may remove a variable with null (updates).
    _marks_nullable: ClassVar[bool] = False
    _secret_env: frozenset[str] = PrivateAttr(default=frozenset())

    @property
    def secret_env(self) -> frozenset[str]:
        return self._secret_env

    @model_validator(mode="wrap")
    @classmethod
    def _secret_marks(cls, data: Any, handler: ModelWrapValidatorHandler[Self]) -> Self:
        marked: frozenset[str] = frozenset()
        field = cls._marks_field
        if isinstance(data, dict) and field in data:
            env, marked = split_marks(data[field], nullable=cls._marks_nullable)
            data = {**data, field: env}
        body = handler(data)
        if marked:
            body._secret_env = marked
        return body


class CreateCluster(_MarksSecrets):
    _marks_field: ClassVar[str] = "env"

    name: str = Field(default="", max_length=200, json_schema_extra={"pattern": NAME_PATTERN})
    # Numbers are strict (here and below): "2" and true are not 2.
    project_id: int | None = Field(default=None, ge=1, le=MAX_ID, strict=True)
    gpu_type: str | None = None
    gpu_count: int | None = Field(default=None, ge=0, le=64, strict=True)
    cpu_cores: int = Field(default=2, ge=1, le=1024, strict=True)
    memory_gb: int = Field(default=4, ge=1, le=16384, strict=True)
    container_disk_gb: int = Field(default=10, ge=1, le=65536, strict=True)
    volume_gb: int = Field(default=0, ge=0, le=1048576, strict=True)
    volume_mount_path: str = Field(
        default="/workspace",
        max_length=MAX_MOUNT_PATH_CHARS,
        json_schema_extra={"pattern": MOUNT_PATH_PATTERN},
    )
    # Required unless template_id names a template (whose image it then is): the
    # default is not validated, an empty string sent is refused.
    docker_image: str = Field(default="", min_length=1, max_length=512)
    docker_args: str = Field(default="", max_length=8192)
    # Replaces the image's ENTRYPOINT (None: the image's own; [] clears it, as the
    # Docker Engine API's ``Entrypoint`` does). docker_args is its command.
    docker_entrypoint: list[Annotated[str, Field(max_length=MAX_ENTRYPOINT_CHARS)]] | None = Field(
        default=None, max_length=MAX_ENTRYPOINT_ITEMS
    )
    # Place only on hosts whose CUDA driver version is at least this ("12.4").
    min_cuda_version: str | None = Field(default=None, max_length=16, pattern=CUDA_VERSION_PATTERN)
    # And (when given) only on hosts whose CUDA driver version is one of these.
    allowed_cuda_versions: (
        list[Annotated[str, Field(max_length=16, pattern=CUDA_VERSION_PATTERN)]] | None
    ) = Field(default=None, max_length=32)
    # A value may be {"value": ..., "secret": true}: see _secret_marks.
    env: Annotated[dict[str, str], WithJsonSchema(env_map_json_schema())] = Field(
        default_factory=dict
    )
    ports: list[PortSpec] = Field(default_factory=list, max_length=64)
    cloud_type: CloudType = CloudType.SECURE
    auto_terminate: AutoTerminatePolicy | None = None
    # Spot: a bid per GPU-hour at or above the GPU type's spot floor; the cluster may
    # be preempted (stopped, volume kept) by on-demand requests or higher bids.
    interruptible: bool = Field(default=False, strict=True)
    bid_per_gpu: float | None = Field(default=None, gt=0, le=1000, strict=True)
    # A clone: the new cluster's volume starts with this snapshot's data.
    snapshot_id: str | None = Field(default=None, min_length=1, max_length=100)
    # Mount this network volume at volume_mount_path instead of a volume of its own
    # (the cluster is placed on the network volume's host).
    network_volume_id: str | None = Field(default=None, min_length=1, max_length=100)
    # A template of the account (services/clusters/templates.py): it fills what this
    # request leaves out (image, docker args, env, ports, disk sizes, mount path).
    template_id: str | None = Field(default=None, min_length=1, max_length=20)
    # The account's registry credentials (/v1/registry-auths) the image is pulled with.
    registry_auth_id: int | None = Field(default=None, ge=1, le=MAX_ID, strict=True)
    # As a start's: the REST answer waits for the cluster to settle (running, or
    # stopped/error/terminated), up to timeout_minutes. Not part of the cluster.
    wait_for_ready: bool = Field(default=False, strict=True)
    timeout_minutes: int = Field(default=10, ge=1, le=30, strict=True)

    @property
    def spot(self) -> bool:
        return self.interruptible or self.bid_per_gpu is not None

    @field_validator("env")
    @classmethod
    def _env(cls, env: dict[str, str]) -> dict[str, str]:
        check_env_limits(env)
        return validate_env(env)

    @field_validator("docker_entrypoint")
    @classmethod
    def _entrypoint(cls, entrypoint: list[str] | None) -> list[str] | None:
        return None if entrypoint is None else check_entrypoint(entrypoint)

    # -- input rules (core/input_rules.py): names, mount path, port labels --
    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        return check_name(name)

    @field_validator("volume_mount_path")
    @classmethod
    def _mount(cls, path: str) -> str:
        return check_mount_path(path)

    @field_validator("ports")
    @classmethod
    def _port_labels(cls, ports: list[PortSpec]) -> list[PortSpec]:
        return check_port_labels(ports)


class ConfigurationUpdate(_Body):
    cpu_cores: int | None = Field(default=None, ge=1, le=1024, strict=True)
    memory_gb: int | None = Field(default=None, ge=1, le=16384, strict=True)
    storage_gb: int | None = Field(default=None, ge=0, le=1048576, strict=True)
    docker_image: str | None = Field(default=None, min_length=1, max_length=512)
    gpu_count: int | None = Field(default=None, ge=0, le=64, strict=True)


class RuleUpdates(_Body):
    """Changes to a policy's rules: only the fields sent apply (a rule sent as null
    is removed). Values have the bounds of ``PolicyRules``; ``enabled`` may be left
    out but not sent as null."""

    enabled: bool = Field(default=True, strict=True)
    idle_minutes: IdleMinutes | None = None
    cost_limit_usd: CostLimitUsd | None = None
    max_runtime_hours: MaxRuntimeHours | None = None


class AutoTerminateUpdate(RuleUpdates):
    """Changes to a cluster's policy; ``action`` (stop or terminate) may be left out
    but not sent as null."""

    action: AutoTerminateAction = "stop"


class TrainingAutoTerminateUpdate(RuleUpdates):
    """Changes to a training cluster's policy; ``action`` (stop or delete) may be
    left out but not sent as null."""

    action: TrainingAutoTerminateAction = "stop"


class StartCluster(_MarksSecrets):
    _marks_field: ClassVar[str] = "environment_updates"
    _marks_nullable: ClassVar[bool] = True

    wait_for_ready: bool = Field(default=False, strict=True)
    timeout_minutes: int = Field(default=10, ge=1, le=30, strict=True)
    update_configuration: ConfigurationUpdate | None = None
    restore_from_snapshot: str | None = Field(default=None, max_length=100)
    # A null value removes the variable; a value may be {"value": ..., "secret": true}.
    environment_updates: Annotated[
        dict[str, str | None] | None, WithJsonSchema(env_map_json_schema(nullable=True))
    ] = None
    port_mapping_updates: list[PortSpec] | None = Field(default=None, max_length=64)
    auto_terminate_updates: AutoTerminateUpdate | None = None
    # When the cluster's host is full, cordoned or unreachable, start it on another host
    # with its volume copied there (false: answer INSUFFICIENT_CAPACITY instead).
    allow_move: bool = Field(default=True, strict=True)
    # Take a snapshot of the stopped volume before applying update_configuration or
    # restore_from_snapshot; the answer names it.
    snapshot_before_changes: bool = Field(default=False, strict=True)

    @field_validator("environment_updates")
    @classmethod
    def _env(cls, env: dict[str, str | None] | None) -> dict[str, str | None] | None:
        if env:
            check_env_limits(env)
            validate_env({k: v or "" for k, v in env.items()})
        return env

    @field_validator("port_mapping_updates")
    @classmethod
    def _port_labels(cls, ports: list[PortSpec] | None) -> list[PortSpec] | None:
        return None if ports is None else check_port_labels(ports)


class BidResume(_Body):
    bid_per_gpu: float = Field(gt=0, le=1000, strict=True)
    gpu_count: int | None = Field(default=None, ge=1, le=64, strict=True)
