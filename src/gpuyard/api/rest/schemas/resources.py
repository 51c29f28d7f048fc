"""OpenAPI models of the training-resource endpoints: request bodies and responses.

Like api/rest/schemas/responses.py, responses forbid unknown fields and the API tests validate real
answers against them, so the documentation cannot drift from what is sent.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    Field,
    StrictStr,
    WithJsonSchema,
    create_model,
    field_validator,
)

from gpuyard.api.rest.schemas.responses import Meta, StrictIn, StrictOut
from gpuyard.core.input_rules import (
    REQUIRED_NAME_PATTERN,
    TEXT_PATTERN,
    check_name,
    check_text,
)

# -- request bodies -----------------------------------------------------------------
# Names refuse control and bidirectional-text characters; descriptions may also hold
# tabs and line breaks (core/input_rules.py). The patterns document it in OpenAPI.
# Names are 1 to 200 characters (services/*: what they store), versions 1 to 100.
Name = Annotated[
    StrictStr,
    Field(min_length=1, max_length=200, json_schema_extra={"pattern": REQUIRED_NAME_PATTERN}),
]
# No text field takes a NUL (StrictIn refuses one anywhere in the body).
NO_NUL = "^[^\\u0000]*$"
Version = Annotated[
    StrictStr,
    Field(min_length=1, max_length=100, json_schema_extra={"pattern": REQUIRED_NAME_PATTERN}),
]
Text = Annotated[StrictStr, Field(json_schema_extra={"pattern": TEXT_PATTERN})]


def _optional_text(value: str | None) -> str | None:
    return None if value is None else check_text(value)


class CreateProject(StrictIn):
    name: Name

    _name = field_validator("name")(check_name)


class AddSshKey(StrictIn):
    name: Name
    # One OpenSSH public key line: "ssh-ed25519 AAAA... comment".
    public_key: StrictStr

    _name = field_validator("name")(check_name)


class CreateRegistryAuth(StrictIn):
    name: Name
    username: Annotated[StrictStr, Field(min_length=1, max_length=500)]
    # Sealed at rest and never answered.
    password: Annotated[StrictStr, Field(min_length=1, max_length=8192)]

    _name = field_validator("name")(check_name)


class UpdateRegistryAuth(StrictIn):
    """The fields sent change (at least one); the password is sealed, never answered."""

    name: Name | None = None
    username: Annotated[StrictStr, Field(min_length=1, max_length=500)] | None = None
    password: Annotated[StrictStr, Field(min_length=1, max_length=8192)] | None = None


class RegisterImage(StrictIn):
    name: Name
    version: Version
    # An image reference the container engine can run.
    image: StrictStr
    description: Text | None = None

    _names = field_validator("name", "version")(check_name)
    _description = field_validator("description")(_optional_text)


class RuleIn(StrictIn):
    protocol: Literal["tcp", "udp", "all"]
    # "22" or "8000-9000" (an integer is taken as a single port); core/network/secgroups.py
    # validates it, so its errors name the field exactly (a union here would not).
    port_range: Annotated[
        Any,
        WithJsonSchema({"anyOf": [{"type": "string", "pattern": NO_NUL}, {"type": "integer"}]}),
    ]
    source_cidr: Annotated[StrictStr, Field(json_schema_extra={"pattern": NO_NUL})]


class SecurityGroupIn(StrictIn):
    """Create, or replace (PUT) every field of, a security group."""

    name: Name
    description: Text | None = None
    rules: list[RuleIn]

    _name = field_validator("name")(check_name)
    _description = field_validator("description")(_optional_text)


# -- responses ----------------------------------------------------------------------


class Project(StrictOut):
    id: int
    name: str
    is_default: bool
    created_at: str | None


class LocationGpuType(StrictOut):
    gpu_type: str
    total_gpus: int
    free_gpus: int


class Location(StrictOut):
    location: str
    hosts: int
    healthy_hosts: int
    gpu_types: list[LocationGpuType]


class Plan(StrictOut):
    sku_id: int
    name: str
    gpu_type: str
    gpus_per_node: int
    cpus_per_node: int
    memory_gb_per_node: int
    price_per_hour: float


class SshKey(StrictOut):
    id: int
    name: str
    public_key: str
    fingerprint: str
    created_at: str | None
    user_id: int | None = Field(
        description="the user who registered it: it opens clusters while they may write"
    )
    project_id: int | None = Field(
        description="the only project whose clusters it opens (registered with a key "
        "restricted to that project); null: every project its user may write to"
    )


class ImageVersion(StrictOut):
    id: int
    name: str
    version: str
    image: str
    description: str
    created_at: str | None


class ReservedIp(StrictOut):
    id: int
    address: str
    project_id: int
    status: Literal["reserved", "attached"]
    training_cluster_id: int | None
    created_at: str | None


class Rule(StrictOut):
    protocol: Literal["tcp", "udp", "all"]
    port_range: str
    source_cidr: str


class SecurityGroup(StrictOut):
    id: int
    name: str
    description: str
    project_id: int
    rules: list[Rule]
    created_at: str | None


class Deleted(StrictOut):
    id: int
    deleted: Literal[True]


def _envelope(name: str, data: Any) -> type[BaseModel]:
    return create_model(
        name,
        __base__=StrictOut,
        success=(Literal[True], ...),
        data=(data, ...),
        meta=(Meta, ...),
    )


class ProjectList(StrictOut):
    projects: list[Project]


class RegistryAuth(StrictOut):
    id: int
    name: str
    created_at: str | None


class RegistryAuthList(StrictOut):
    registry_auths: list[RegistryAuth]


class LocationList(StrictOut):
    locations: list[Location]


class PlanList(StrictOut):
    plans: list[Plan]


class SshKeyList(StrictOut):
    ssh_keys: list[SshKey]


class ImageList(StrictOut):
    images: list[ImageVersion]


class ReservedIpList(StrictOut):
    reserved_ips: list[ReservedIp]


class SecurityGroupList(StrictOut):
    security_groups: list[SecurityGroup]


ProjectEnvelope = _envelope("ProjectEnvelope", Project)
ProjectListEnvelope = _envelope("ProjectListEnvelope", ProjectList)
LocationListEnvelope = _envelope("LocationListEnvelope", LocationList)
PlanListEnvelope = _envelope("PlanListEnvelope", PlanList)
SshKeyEnvelope = _envelope("SshKeyEnvelope", SshKey)
SshKeyListEnvelope = _envelope("SshKeyListEnvelope", SshKeyList)
RegistryAuthEnvelope = _envelope("RegistryAuthEnvelope", RegistryAuth)
RegistryAuthListEnvelope = _envelope("RegistryAuthListEnvelope", RegistryAuthList)
ImageEnvelope = _envelope("ImageEnvelope", ImageVersion)
ImageListEnvelope = _envelope("ImageListEnvelope", ImageList)
ReservedIpEnvelope = _envelope("ReservedIpEnvelope", ReservedIp)
ReservedIpListEnvelope = _envelope("ReservedIpListEnvelope", ReservedIpList)
SecurityGroupEnvelope = _envelope("SecurityGroupEnvelope", SecurityGroup)
SecurityGroupListEnvelope = _envelope("SecurityGroupListEnvelope", SecurityGroupList)
DeletedEnvelope = _envelope("DeletedEnvelope", Deleted)
