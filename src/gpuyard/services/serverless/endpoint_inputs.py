"""Validated inputs of the endpoint use cases (services/serverless/endpoints.py); the
REST API uses them as bodies. An endpoint names its image directly (``image``) or
through a template (``template_id``: the template's image, env, disk sizes and mount
path fill what the body leaves out); env values may be marked ``{"value": ...,
"secret": true}`` as a cluster's are. Limits that depend on the installation (the most
workers an endpoint may have) are checked by the use case."""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import Field, WithJsonSchema, field_validator

from gpuyard.core.input_rules import (
    MAX_MOUNT_PATH_CHARS,
    MOUNT_PATH_PATTERN,
    REQUIRED_NAME_PATTERN,
    check_env_limits,
    check_mount_path,
    check_name,
)
from gpuyard.core.models import validate_env
from gpuyard.core.secret_env import env_map_json_schema
from gpuyard.core.serverless.scaling import ScalerType
from gpuyard.services.clusters.requests import _MarksSecrets

MAX_ENDPOINT_NAME_CHARS = 160
MAX_GPU_TYPES = 32
MAX_LOCATIONS = 32
MAX_IDLE_TIMEOUT_S = 86_400
MAX_SCALER_VALUE = 10_000
# A week: RunPod's longest execution timeout is a few days.
MAX_EXECUTION_TIMEOUT_MS = 7 * 86_400_000
MAX_WORKERS_CAP = 10_000

GpuTypeId = Annotated[str, Field(min_length=1, max_length=100)]
LocationId = Annotated[str, Field(min_length=1, max_length=100)]


def _name(value: str | None) -> str | None:
    if value is None:
        return None
    value = check_name(value).strip()
    if not value:
        raise ValueError("must not be blank")
    return value


def _env(env: dict[str, str] | None) -> dict[str, str] | None:
    if env is None:
        return None
    check_env_limits(env)
    return validate_env(env)


def _mount(path: str | None) -> str | None:
    return None if path is None else check_mount_path(path)


def _distinct(values: list[str] | None) -> list[str] | None:
    if values is None:
        return None
    return list(dict.fromkeys(v.strip() for v in values if v.strip()))


class CreateEndpoint(_MarksSecrets):
    """A new endpoint: ``name`` (unique among the account's live endpoints) and one of
    ``template_id`` and ``image`` are required. ``gpu_type_ids`` are catalog ids (or
    display names); at least one unless ``gpu_count`` is 0. ``workers_max`` is at least
    ``workers_min`` and at most the installation's cap. Disk sizes and the mount path
    left out come from the template, else the defaults shown."""

    _marks_field: ClassVar[str] = "env"

    name: str = Field(
        min_length=1,
        max_length=MAX_ENDPOINT_NAME_CHARS,
        json_schema_extra={"pattern": REQUIRED_NAME_PATTERN},
    )
    template_id: str | None = Field(default=None, min_length=1, max_length=20)
    image: str | None = Field(default=None, min_length=1, max_length=512)
    gpu_type_ids: list[GpuTypeId] = Field(default_factory=list, max_length=MAX_GPU_TYPES)
    gpu_count: int = Field(default=1, ge=0, le=64, strict=True)
    cpu_cores: int = Field(default=2, ge=1, le=1024, strict=True)
    memory_gb: int = Field(default=4, ge=1, le=16384, strict=True)
    # None: the template's, else 10.
    container_disk_gb: int | None = Field(default=None, ge=1, le=65536, strict=True)
    # None: the template's, else 0.
    volume_gb: int | None = Field(default=None, ge=0, le=1048576, strict=True)
    # None: the template's, else /runpod-volume.
    volume_mount_path: str | None = Field(
        default=None,
        max_length=MAX_MOUNT_PATH_CHARS,
        json_schema_extra={"pattern": MOUNT_PATH_PATTERN},
    )
    workers_min: int = Field(default=0, ge=0, le=MAX_WORKERS_CAP, strict=True)
    workers_max: int = Field(default=3, ge=0, le=MAX_WORKERS_CAP, strict=True)
    idle_timeout_s: int = Field(default=5, ge=1, le=MAX_IDLE_TIMEOUT_S, strict=True)
    scaler_type: ScalerType = ScalerType.QUEUE_DELAY
    scaler_value: int = Field(default=4, ge=1, le=MAX_SCALER_VALUE, strict=True)
    # A job's execution timeout when its policy sets none; 0: none.
    execution_timeout_ms: int = Field(
        default=600_000, ge=0, le=MAX_EXECUTION_TIMEOUT_MS, strict=True
    )
    env: Annotated[dict[str, str], WithJsonSchema(env_map_json_schema())] = Field(
        default_factory=dict
    )
    network_volume_id: str | None = Field(default=None, min_length=1, max_length=64)
    # Location ids workers may be placed in; empty: anywhere.
    locations: list[LocationId] = Field(default_factory=list, max_length=MAX_LOCATIONS)
    flashboot: bool = Field(default=False, strict=True)

    _v_name = field_validator("name")(_name)
    _v_env = field_validator("env")(_env)
    _v_mount = field_validator("volume_mount_path")(_mount)
    _v_lists = field_validator("gpu_type_ids", "locations")(_distinct)


class UpdateEndpoint(_MarksSecrets):
    """Changes to an endpoint: only the fields sent apply, and new workers get them
    (running jobs finish on the workers they run on). ``env`` replaces the map (the
    mask sent back keeps a secret's value); ``network_volume_id`` sent as null
    detaches the volume; a new ``template_id`` fills image, env, disk sizes and mount
    path the body leaves out."""

    _marks_field: ClassVar[str] = "env"

    name: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_ENDPOINT_NAME_CHARS,
        json_schema_extra={"pattern": REQUIRED_NAME_PATTERN},
    )
    template_id: str | None = Field(default=None, min_length=1, max_length=20)
    image: str | None = Field(default=None, min_length=1, max_length=512)
    gpu_type_ids: list[GpuTypeId] | None = Field(default=None, max_length=MAX_GPU_TYPES)
    gpu_count: int | None = Field(default=None, ge=0, le=64, strict=True)
    cpu_cores: int | None = Field(default=None, ge=1, le=1024, strict=True)
    memory_gb: int | None = Field(default=None, ge=1, le=16384, strict=True)
    container_disk_gb: int | None = Field(default=None, ge=1, le=65536, strict=True)
    volume_gb: int | None = Field(default=None, ge=0, le=1048576, strict=True)
    volume_mount_path: str | None = Field(
        default=None,
        max_length=MAX_MOUNT_PATH_CHARS,
        json_schema_extra={"pattern": MOUNT_PATH_PATTERN},
    )
    workers_min: int | None = Field(default=None, ge=0, le=MAX_WORKERS_CAP, strict=True)
    workers_max: int | None = Field(default=None, ge=0, le=MAX_WORKERS_CAP, strict=True)
    idle_timeout_s: int | None = Field(default=None, ge=1, le=MAX_IDLE_TIMEOUT_S, strict=True)
    scaler_type: ScalerType | None = None
    scaler_value: int | None = Field(default=None, ge=1, le=MAX_SCALER_VALUE, strict=True)
    execution_timeout_ms: int | None = Field(
        default=None, ge=0, le=MAX_EXECUTION_TIMEOUT_MS, strict=True
    )
    env: Annotated[dict[str, str] | None, WithJsonSchema(env_map_json_schema())] = None
    network_volume_id: str | None = Field(default=None, min_length=1, max_length=64)
    locations: list[LocationId] | None = Field(default=None, max_length=MAX_LOCATIONS)
    flashboot: bool | None = Field(default=None, strict=True)

    _v_name = field_validator("name")(_name)
    _v_env = field_validator("env")(_env)
    _v_mount = field_validator("volume_mount_path")(_mount)
    _v_lists = field_validator("gpu_type_ids", "locations")(_distinct)
