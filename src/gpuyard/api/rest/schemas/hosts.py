"""OpenAPI models of ``/v1/hosts``: the body of ``POST /v1/hosts`` and every answer.
Like api/rest/schemas/responses.py, unknown fields are forbidden (in bodies: 400
naming the field) and the API tests validate real answers against them."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    StrictStr,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from gpuyard.api.rest.schemas.responses import Meta, StrictIn, StrictOut
from gpuyard.core.input_rules import CUDA_VERSION_PATTERN, REQUIRED_NAME_PATTERN, check_name
from gpuyard.core.models import CloudType, whole_floats_as_ints
from gpuyard.core.network.engine_address import ENGINE_URL_PATTERN, MAX_ENGINE_URL_CHARS
from gpuyard.core.text import refuse_nul
from gpuyard.services.fleet.admin import (
    MAX_HOST_GPUS,
    UNCHANGED,
    GpuCount,
    HostChanges,
    NewHost,
)


class _In(StrictIn):
    """Also takes whole floats where integers are asked (``2.0`` GPUs)."""

    @model_validator(mode="before")
    @classmethod
    def _no_nul(cls, data: Any) -> Any:
        return whole_floats_as_ints(cls, refuse_nul(data))


# -- POST /v1/hosts ---------------------------------------------------------------------

GpuTypeName = Annotated[
    StrictStr,
    Field(min_length=1, max_length=100, json_schema_extra={"pattern": REQUIRED_NAME_PATTERN}),
]


class GpuCountIn(_In):
    # A catalog id ("NVIDIA RTX A6000") or display name ("RTX A6000").
    gpu_type: GpuTypeName
    count: int = Field(ge=1, le=MAX_HOST_GPUS, strict=True)

    _type = field_validator("gpu_type")(check_name)


# "TYPE:COUNT[,TYPE:COUNT...]"; the empty string declares no GPUs.
GPU_SPEC_PATTERN = r"^([^:,\x00-\x1f]+:[0-9]{1,3}(,[^:,\x00-\x1f]+:[0-9]{1,3})*)?$"
_GPUS_SCHEMA: dict[str, Any] = {
    "anyOf": [
        {"type": "string", "maxLength": 2000, "pattern": GPU_SPEC_PATTERN},
        {
            "type": "array",
            "maxItems": MAX_HOST_GPUS,
            "items": {
                "type": "object",
                "properties": {
                    "gpu_type": {
                        "type": "string",
                        "minLength": 1,
                        "maxLength": 100,
                        "pattern": REQUIRED_NAME_PATTERN,
                    },
                    "count": {"type": "integer", "minimum": 1, "maximum": MAX_HOST_GPUS},
                },
                "required": ["gpu_type", "count"],
                "additionalProperties": False,
            },
        },
        {"type": "null"},
    ],
    "description": 'Declared GPUs: "NVIDIA RTX A6000:4" (comma-separated for several '
    "types) or [{gpu_type, count}]; absent: discovered on the host",
}


def _gpu_counts(value: Any) -> tuple[GpuCount, ...] | None:
    """The ``gpus`` field: a ``"TYPE:COUNT,..."`` string or a list of objects."""
    if value is None:
        return None
    if isinstance(value, str):
        out = []
        for part in filter(None, (p.strip() for p in value.split(","))):
            name, sep, count = part.rpartition(":")
            name, count = name.strip(), count.strip()
            if not sep or not name or not count.isascii() or not count.isdigit():
                raise ValueError(f"expected 'TYPE:COUNT' (e.g. 'NVIDIA RTX A6000:4'), got {part!r}")
            check_name(name)
            if not 1 <= int(count[:4]) <= MAX_HOST_GPUS:
                raise ValueError(f"{part!r}: the count must be 1 to {MAX_HOST_GPUS}")
            out.append(GpuCount(name, int(count)))
        return tuple(out)
    if isinstance(value, list):
        if len(value) > MAX_HOST_GPUS:
            raise ValueError(f"at most {MAX_HOST_GPUS} entries")
        items = []
        for i, item in enumerate(value):
            try:
                parsed = GpuCountIn.model_validate(item)
            except ValidationError as exc:
                first = exc.errors()[0]
                where = ".".join(str(p) for p in first.get("loc", ()))
                raise ValueError(f"[{i}]{'.' + where if where else ''}: {first['msg']}") from None
            items.append(GpuCount(parsed.gpu_type, parsed.count))
        return tuple(items)
    raise ValueError('must be a string like "NVIDIA RTX A6000:4" or a list of {gpu_type, count}')


class AddHostIn(_In):
    """A host to add; inventory figures left out are discovered through its engine."""

    name: Annotated[
        StrictStr,
        Field(min_length=1, max_length=200, json_schema_extra={"pattern": REQUIRED_NAME_PATTERN}),
    ]
    # unix:///path.sock | ssh://user@host[:port][/socket/path] | tcp://host:port
    engine_url: Annotated[
        StrictStr,
        Field(
            min_length=1,
            max_length=MAX_ENGINE_URL_CHARS,
            json_schema_extra={"pattern": ENGINE_URL_PATTERN},
        ),
    ]
    # Where users reach its published ports (a DNS name or IP address); default: the
    # engine URL's host (ssh://, tcp://) or this server's address (unix://).
    address: Annotated[
        StrictStr | None,
        Field(max_length=253, json_schema_extra={"pattern": r"^[A-Za-z0-9.:-]+$"}),
    ] = None
    # Where clients reach its published ports when not at ``address`` (a DNS name or
    # IP address); default: at ``address``.
    client_address: Annotated[
        StrictStr | None,
        Field(max_length=253, json_schema_extra={"pattern": r"^[A-Za-z0-9.:-]+$"}),
    ] = None
    # Default: the server's own location (GPUYARD_LOCAL_LOCATION).
    location: Annotated[
        StrictStr | None,
        Field(min_length=1, max_length=100, json_schema_extra={"pattern": REQUIRED_NAME_PATTERN}),
    ] = None
    cloud_type: Literal["secure", "community", "SECURE", "COMMUNITY"] = "secure"
    gpus: Annotated[Any, WithJsonSchema(_GPUS_SCHEMA)] = None
    vcpus: int | None = Field(default=None, ge=1, le=65536, strict=True)
    memory_gb: int | None = Field(default=None, ge=1, le=16 * 1024 * 1024, strict=True)
    disk_gb: int | None = Field(default=None, ge=1, le=1024 * 1024 * 1024, strict=True)
    # The CUDA driver version ("12.4") where NVML cannot tell it (declared GPUs);
    # discovered otherwise.
    cuda_version: Annotated[
        StrictStr | None, Field(max_length=16, pattern=CUDA_VERSION_PATTERN)
    ] = None
    # For tcp:// engines: a directory on the server's machine holding ca.pem, cert.pem
    # and key.pem (needed unless the engine is on loopback).
    engine_tls_dir: Annotated[
        StrictStr | None,
        Field(min_length=2, max_length=500, json_schema_extra={"pattern": r"^/[^\x00-\x1f]*$"}),
    ] = None

    @field_validator("name", "location")
    @classmethod
    def _name(cls, value: str | None) -> str | None:
        # Stored stripped, like every other name; a blank one is refused.
        if value is None:
            return None
        value = check_name(value).strip()
        if not value:
            raise ValueError("must not be blank")
        return value

    @field_validator("gpus", mode="before")
    @classmethod
    def _gpus(cls, value: Any) -> tuple[GpuCount, ...] | None:
        return _gpu_counts(value)

    def spec(self) -> NewHost:
        """The use case's input."""
        return NewHost(
            name=self.name,
            engine_url=self.engine_url,
            address=self.address,
            client_address=self.client_address,
            location=self.location,
            cloud_type=CloudType(self.cloud_type.upper()),
            gpus=self.gpus,
            vcpus=self.vcpus,
            memory_gb=self.memory_gb,
            disk_gb=self.disk_gb,
            engine_tls_dir=self.engine_tls_dir,
            cuda_version=self.cuda_version,
        )


class UpdateHostIn(_In):
    """Settings of a host; a field left out stays as it is."""

    # The CUDA driver version ("12.4") the operator declares; null: back to what is
    # discovered (unknown until then).
    cuda_version: Annotated[
        StrictStr | None, Field(max_length=16, pattern=CUDA_VERSION_PATTERN)
    ] = None

    # Where clients reach its published ports (a DNS name or IP address); null: at
    # the host's ``address``.
    client_address: Annotated[
        StrictStr | None,
        Field(max_length=253, json_schema_extra={"pattern": r"^[A-Za-z0-9.:-]+$"}),
    ] = None

    def changes(self) -> HostChanges:
        """The use case's input: only the fields sent."""
        sent = self.model_fields_set
        return HostChanges(
            client_address=self.client_address if "client_address" in sent else UNCHANGED,
            cuda_version=self.cuda_version if "cuda_version" in sent else UNCHANGED,
        )


# -- answers ------------------------------------------------------------------------------


class EngineReach(StrictOut):
    reachable: bool
    # Why the engine cannot be reached (what to install or start); null when it can.
    message: str | None


class HostGpuOut(StrictOut):
    index: int
    type: str
    uuid: str | None
    allocated: bool


class FreeResources(StrictOut):
    host_id: int
    # Free GPUs by type.
    gpus: dict[str, int]
    vcpus: float
    memory_gb: float
    disk_gb: float


class Resources(StrictOut):
    # GPUs by type.
    gpus: dict[str, int]
    vcpus: float
    memory_gb: float
    disk_gb: float


class Capacity(StrictOut):
    # What the host has, what clusters and training nodes hold there (reservations,
    # GPU allocations, volumes still moving away) and what is left for new placements
    # (the allocation ratios applied: GPUYARD_*_ALLOCATION_RATIO).
    total: Resources
    allocated: Resources
    free: Resources


class InventorySources(StrictOut):
    vcpus: Literal["declared", "discovered"]
    memory_gb: Literal["declared", "discovered"]
    disk_gb: Literal["declared", "discovered"]
    gpus: Literal["declared", "discovered"]


class HostWorkload(StrictOut):
    kind: Literal["cluster", "training_node"]
    # A cluster id, or ``tn-<node id>`` for a training cluster's node.
    id: str
    name: str
    status: str
    # GPUs it asks for, and those it holds on this host now (none while stopped).
    gpu_count: int
    gpus_held: int
    training_cluster_id: int | None


class HostProxy(StrictOut):
    available: bool
    # Why proxy URLs are null (Caddy missing or refusing, the proxy disabled).
    reason: str | None


# A host as answered: these fields, in this order, each the same-named field of
# services/fleet/views.py HostView unless api/rest/hosts.py ``host_view`` works it out
# (tests/unit/test_host_shape.py names what either side has beyond the other). A
# comment, not a docstring: a docstring would become the schema's OpenAPI description.
class HostOut(StrictOut):
    id: int
    name: str
    # The machine's stable id (GPUYARD_HOME/host-id, first derived from
    # /etc/machine-id): a renamed machine keeps its row. Null for a host added through
    # the API and for a row no server has claimed since host ids were introduced.
    machine_id: str | None
    location: str
    cloud_type: str
    address: str
    # Where clients reach its published ports (what pods' public SSH entries show)
    # when not at ``address``: a NAT's outside address, a DNS name. Null: at ``address``.
    client_address: str | None
    # Never carries credentials (a password or query is cut off).
    engine_url: str | None
    # For a tcp:// engine: where its TLS client certificates are on the server.
    engine_tls_dir: str | None
    # "docker" or "podman" and its version, as the engine answered (null until then).
    engine_name: str | None
    engine_version: str | None
    # The engine as last seen: for the server's own machine asked now, for any other
    # host its last heartbeat (``message``: why it did not answer).
    engine: EngineReach
    # The machine a gpuyard server runs on (registered at start; cannot be deleted).
    is_local: bool
    # active: takes placements; cordoned: keeps what runs, takes nothing new;
    # draining: cordoned, and its clusters are being moved away.
    status: Literal["active", "cordoned", "draining"]
    # unknown until the first heartbeat; unreachable after the allowed misses.
    reachability: Literal["reachable", "unreachable", "unknown"]
    # Reachable and in use by placement (false before the first heartbeat answers).
    healthy: bool
    last_heartbeat_at: str | None
    unreachable_since: str | None
    missed_heartbeats: int
    heartbeat_error: str | None
    vcpus: int
    memory_gb: int
    disk_gb: int
    gpu_source: Literal["nvml", "declared"]
    declared: list[str]
    # False when the engine cannot apply CPU and memory limits to containers;
    # ``limits_note`` says why.
    enforces_limits: bool
    limits_note: str | None
    # False when volume or container disk sizes are not enforced there (a write past
    # them would not fail); ``disk_note`` says why.
    enforces_disk: bool
    disk_note: str | None
    # The CUDA driver version clusters' min_cuda_version is compared with: NVML's (or
    # nvidia-smi's on another host), else what the operator declared; null: unknown,
    # which meets no minimum.
    cuda_version: str | None
    # Where each inventory figure came from.
    inventory: InventorySources
    gpus: list[HostGpuOut]
    free: FreeResources
    capacity: Capacity
    # Clusters and training nodes holding capacity (or their volume) on the host.
    clusters: list[HostWorkload]
    created_at: str
    # Whether its clusters' http ports are reachable through the HTTP proxy.
    proxy: HostProxy


class HostList(StrictOut):
    # This installation's UUID: every engine object gpuyard makes carries it as the
    # ``gpuyard.installation`` label.
    installation_id: str
    hosts: list[HostOut]


class HostListEnvelope(StrictOut):
    success: Literal[True]
    data: HostList
    meta: Meta


class HostEnvelope(StrictOut):
    success: Literal[True]
    data: HostOut
    meta: Meta


class CannotMove(StrictOut):
    cluster_id: str
    reason: str


class TrainingNodeMoving(StrictOut):
    node_id: int
    name: str
    training_cluster_id: int
    # Where the node is recreated (a stopped cluster's: where it starts next).
    to_host_id: int


class TrainingNodeStays(StrictOut):
    node_id: int
    name: str
    training_cluster_id: int
    role: str
    reason: str


class TrainingDrainOut(StrictOut):
    # Workers recreated on other hosts of their location (same names, Slurm state kept).
    moving: list[TrainingNodeMoving]
    # Nodes that stay for now, each with why (retried while the host drains).
    cannot_move: list[TrainingNodeStays]


class DrainOut(StrictOut):
    # Running clusters being stopped, to start again on another host.
    stopping: list[str]
    # Stopped clusters whose volume is being moved to another host.
    moving: list[str]
    cannot_move: list[CannotMove]
    training_nodes: TrainingDrainOut


class HostDrained(StrictOut):
    host: HostOut
    drain: DrainOut


class HostDrainEnvelope(StrictOut):
    success: Literal[True]
    data: HostDrained
    meta: Meta


class HostDeleted(StrictOut):
    id: int
    name: str
    deleted: Literal[True]


class HostDeletedEnvelope(StrictOut):
    success: Literal[True]
    data: HostDeleted
    meta: Meta


class SshPublicKey(StrictOut):
    # One OpenSSH line: add it to ~/.ssh/authorized_keys of the user in a host's
    # ssh:// engine URL.
    public_key: str


class SshPublicKeyEnvelope(StrictOut):
    success: Literal[True]
    data: SshPublicKey
    meta: Meta
