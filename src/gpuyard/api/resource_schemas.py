"""OpenAPI models of the training-resource endpoints: request bodies and responses.

Like api/schemas.py, responses forbid unknown fields and the API tests validate real
answers against them, so the documentation cannot drift from what is sent.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictStr,
    WithJsonSchema,
    create_model,
    field_validator,
    model_validator,
)

from gpuyard.api.schemas import Meta
from gpuyard.core.input_rules import (
    REQUIRED_NAME_PATTERN,
    TEXT_PATTERN,
    check_name,
    check_text,
)
from gpuyard.core.text import refuse_nul


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _no_nul(cls, data: Any) -> Any:
        return refuse_nul(data)


# -- request bodies -----------------------------------------------------------------
# Names refuse control and bidirectional-text characters; descriptions may also hold
# tabs and line breaks (core/input_rules.py). The patterns document it in OpenAPI.
# Names are 1 to 200 characters (services/*: what they store), versions 1 to 100.
Name = Annotated[
    StrictStr,
    Field(min_length=1, max_length=200, json_schema_extra={"pattern": REQUIRED_NAME_PATTERN}),
]
# No text field takes a NUL (_In refuses one anywhere in the body).
NO_NUL = "^[^\\u0000]*$"
Version = Annotated[
    StrictStr,
    Field(min_length=1, max_length=100, json_schema_extra={"pattern": REQUIRED_NAME_PATTERN}),
]
Text = Annotated[StrictStr, Field(json_schema_extra={"pattern": TEXT_PATTERN})]


def _optional_text(value: str | None) -> str | None:
    return None if value is None else check_text(value)


class CreateProject(_In):
    name: Name

    _name = field_validator("name")(check_name)


class AddSshKey(_In):
    name: Name
    # One OpenSSH public key line: "ssh-ed25519 AAAA... comment".
    public_key: StrictStr

    _name = field_validator("name")(check_name)


class RegisterImage(_In):
    name: Name
    version: Version
    # An image reference the container engine can run.
    image: StrictStr
    description: Text | None = None

    _names = field_validator("name", "version")(check_name)
    _description = field_validator("description")(_optional_text)


class RuleIn(_In):
    protocol: Literal["tcp", "udp", "all"]
    # "22" or "8000-9000" (an integer is taken as a single port); core/secgroups.py
    # validates it, so its errors name the field exactly (a union here would not).
    port_range: Annotated[
        Any,
        WithJsonSchema({"anyOf": [{"type": "string", "pattern": NO_NUL}, {"type": "integer"}]}),
    ]
    source_cidr: Annotated[StrictStr, Field(json_schema_extra={"pattern": NO_NUL})]


class SecurityGroupIn(_In):
    """Create, or replace (PUT) every field of, a security group."""

    name: Name
    description: Text | None = None
    rules: list[RuleIn]

    _name = field_validator("name")(check_name)
    _description = field_validator("description")(_optional_text)


# -- responses ----------------------------------------------------------------------


class Project(_Out):
    id: int
    name: str
    is_default: bool
    created_at: str | None


class LocationGpuType(_Out):
    gpu_type: str
    total_gpus: int
    free_gpus: int


class Location(_Out):
    location: str
    hosts: int
    healthy_hosts: int
    gpu_types: list[LocationGpuType]


class Plan(_Out):
    sku_id: int
    name: str
    gpu_type: str
    gpus_per_node: int
    cpus_per_node: int
    memory_gb_per_node: int
    price_per_hour: float


class SshKey(_Out):
    id: int
    name: str
    public_key: str
    fingerprint: str
    created_at: str | None


class ImageVersion(_Out):
    id: int
    name: str
    version: str
    image: str
    description: str
    created_at: str | None


class ReservedIp(_Out):
    id: int
    address: str
    project_id: int
    status: Literal["reserved", "attached"]
    training_cluster_id: int | None
    created_at: str | None


class Rule(_Out):
    protocol: Literal["tcp", "udp", "all"]
    port_range: str
    source_cidr: str


class SecurityGroup(_Out):
    id: int
    name: str
    description: str
    project_id: int
    rules: list[Rule]
    created_at: str | None


class Deleted(_Out):
    id: int
    deleted: Literal[True]


def _envelope(name: str, data: Any) -> type[BaseModel]:
    return create_model(
        name,
        __base__=_Out,
        success=(Literal[True], ...),
        data=(data, ...),
        meta=(Meta, ...),
    )


class ProjectList(_Out):
    projects: list[Project]


class LocationList(_Out):
    locations: list[Location]


class PlanList(_Out):
    plans: list[Plan]


class SshKeyList(_Out):
    ssh_keys: list[SshKey]


class ImageList(_Out):
    images: list[ImageVersion]


class ReservedIpList(_Out):
    reserved_ips: list[ReservedIp]


class SecurityGroupList(_Out):
    security_groups: list[SecurityGroup]


ProjectEnvelope = _envelope("ProjectEnvelope", Project)
ProjectListEnvelope = _envelope("ProjectListEnvelope", ProjectList)
LocationListEnvelope = _envelope("LocationListEnvelope", LocationList)
PlanListEnvelope = _envelope("PlanListEnvelope", PlanList)
SshKeyEnvelope = _envelope("SshKeyEnvelope", SshKey)
SshKeyListEnvelope = _envelope("SshKeyListEnvelope", SshKeyList)
ImageEnvelope = _envelope("ImageEnvelope", ImageVersion)
ImageListEnvelope = _envelope("ImageListEnvelope", ImageList)
ReservedIpEnvelope = _envelope("ReservedIpEnvelope", ReservedIp)
ReservedIpListEnvelope = _envelope("ReservedIpListEnvelope", ReservedIpList)
SecurityGroupEnvelope = _envelope("SecurityGroupEnvelope", SecurityGroup)
SecurityGroupListEnvelope = _envelope("SecurityGroupListEnvelope", SecurityGroupList)
DeletedEnvelope = _envelope("DeletedEnvelope", Deleted)
