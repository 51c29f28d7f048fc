"""Validated inputs of the template use cases (services/clusters/templates.py); the
REST API uses them as bodies. A template holds what a cluster create would: image,
env (a value may be marked ``{"value": ..., "secret": true}``), ports, disk sizes,
mount path, docker args, plus a start script (run as the command when there are no
docker args), a readme, registry credentials (one of the account's, by id) and RunPod's
serverless flag."""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import Field, WithJsonSchema, field_validator

from gpuyard.core.input_rules import (
    MAX_ENTRYPOINT_CHARS,
    MAX_ENTRYPOINT_ITEMS,
    MAX_MOUNT_PATH_CHARS,
    MOUNT_PATH_PATTERN,
    REQUIRED_NAME_PATTERN,
    check_entrypoint,
    check_env_limits,
    check_mount_path,
    check_name,
    check_text,
)
from gpuyard.core.models import PortSpec, validate_env
from gpuyard.core.secret_env import env_map_json_schema
from gpuyard.services.clusters.requests import _MarksSecrets, check_port_labels

MAX_TEMPLATE_NAME_CHARS = 200
MAX_README_CHARS = 100_000
MAX_START_SCRIPT_CHARS = 65_536
MAX_REGISTRY_AUTH_ID_CHARS = 100


def _public(value: bool | None) -> bool | None:
    if value:
        raise ValueError("public templates are not offered: a template is its account's own")
    return value


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


def _text(value: str | None) -> str | None:
    return None if value is None else check_text(value)


def _mount(path: str | None) -> str | None:
    return None if path is None else check_mount_path(path)


def _entrypoint(entrypoint: list[str] | None) -> list[str] | None:
    return None if entrypoint is None else check_entrypoint(entrypoint)


def _ports(ports: list[PortSpec] | None) -> list[PortSpec] | None:
    return None if ports is None else check_port_labels(ports)


class CreateTemplate(_MarksSecrets):
    """A new template: ``name`` (unique in the account) and ``docker_image`` are
    required; the rest has a cluster create's defaults."""

    _marks_field: ClassVar[str] = "env"

    name: str = Field(
        min_length=1,
        max_length=MAX_TEMPLATE_NAME_CHARS,
        json_schema_extra={"pattern": REQUIRED_NAME_PATTERN},
    )
    docker_image: str = Field(min_length=1, max_length=512)
    docker_args: str = Field(default="", max_length=8192)
    # The ENTRYPOINT its clusters get (None: the image's own; []: none).
    docker_entrypoint: list[Annotated[str, Field(max_length=MAX_ENTRYPOINT_CHARS)]] | None = Field(
        default=None, max_length=MAX_ENTRYPOINT_ITEMS
    )
    start_script: str = Field(default="", max_length=MAX_START_SCRIPT_CHARS)
    env: Annotated[dict[str, str], WithJsonSchema(env_map_json_schema())] = Field(
        default_factory=dict
    )
    ports: list[PortSpec] = Field(default_factory=list, max_length=64)
    container_disk_gb: int = Field(default=10, ge=1, le=65536, strict=True)
    volume_gb: int = Field(default=0, ge=0, le=1048576, strict=True)
    volume_mount_path: str = Field(
        default="/workspace",
        max_length=MAX_MOUNT_PATH_CHARS,
        json_schema_extra={"pattern": MOUNT_PATH_PATTERN},
    )
    readme: str = Field(default="", max_length=MAX_README_CHARS)
    # A registry credential's id, kept as given (None: the registry needs none).
    container_registry_auth_id: str | None = Field(
        default=None, min_length=1, max_length=MAX_REGISTRY_AUTH_ID_CHARS
    )
    # Only false: templates are never shared with other accounts.
    is_public: bool = Field(default=False, strict=True)
    # RunPod's isServerless: a template for serverless endpoints (stored, answered).
    is_serverless: bool = Field(default=False, strict=True)

    _v_name = field_validator("name")(_name)
    _v_env = field_validator("env")(_env)
    _v_readme = field_validator("readme", "start_script", "docker_args")(_text)
    _v_mount = field_validator("volume_mount_path")(_mount)
    _v_ports = field_validator("ports")(_ports)
    _v_public = field_validator("is_public")(_public)
    _v_entrypoint = field_validator("docker_entrypoint")(_entrypoint)


class UpdateTemplate(_MarksSecrets):
    """Changes to a template: only the fields sent apply. ``env`` replaces the whole
    map, but the mask sent back for a secret keeps its stored value (a client that
    reads a template and writes it back changes nothing); ``container_registry_auth_id``
    sent as null clears it."""

    _marks_field: ClassVar[str] = "env"

    name: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_TEMPLATE_NAME_CHARS,
        json_schema_extra={"pattern": REQUIRED_NAME_PATTERN},
    )
    docker_image: str | None = Field(default=None, min_length=1, max_length=512)
    docker_args: str | None = Field(default=None, max_length=8192)
    # Sent as null: back to the image's own.
    docker_entrypoint: list[Annotated[str, Field(max_length=MAX_ENTRYPOINT_CHARS)]] | None = Field(
        default=None, max_length=MAX_ENTRYPOINT_ITEMS
    )
    start_script: str | None = Field(default=None, max_length=MAX_START_SCRIPT_CHARS)
    env: Annotated[dict[str, str] | None, WithJsonSchema(env_map_json_schema())] = None
    ports: list[PortSpec] | None = Field(default=None, max_length=64)
    container_disk_gb: int | None = Field(default=None, ge=1, le=65536, strict=True)
    volume_gb: int | None = Field(default=None, ge=0, le=1048576, strict=True)
    volume_mount_path: str | None = Field(
        default=None,
        max_length=MAX_MOUNT_PATH_CHARS,
        json_schema_extra={"pattern": MOUNT_PATH_PATTERN},
    )
    readme: str | None = Field(default=None, max_length=MAX_README_CHARS)
    container_registry_auth_id: str | None = Field(
        default=None, min_length=1, max_length=MAX_REGISTRY_AUTH_ID_CHARS
    )
    is_public: bool | None = Field(default=None, strict=True)
    is_serverless: bool | None = Field(default=None, strict=True)

    _v_name = field_validator("name")(_name)
    _v_env = field_validator("env")(_env)
    _v_readme = field_validator("readme", "start_script", "docker_args")(_text)
    _v_mount = field_validator("volume_mount_path")(_mount)
    _v_ports = field_validator("ports")(_ports)
    _v_public = field_validator("is_public")(_public)
    _v_entrypoint = field_validator("docker_entrypoint")(_entrypoint)
