# Strawberry's field decorators are typed as returning Any; the resolvers are typed.
# mypy: disable-error-code="untyped-decorator"
"""RunPod's serverless endpoints on the GraphQL API, as the unmodified runpod-python
sends them: the ``Endpoint`` type (``myself { endpoints }``, what
``runpod.get_endpoints()`` asks), ``saveEndpoint`` (``runpod.create_endpoint``; an
update when ``input.id`` is given), ``updateEndpointTemplate`` and ``deleteEndpoint``.
They answer through the same use cases as ``/v1/endpoints``
(services/serverless/endpoints.py); reads need READ_RESOURCES, changes
WRITE_RESOURCES (api/graphql/access.py).

RunPod's texts become gpuyard's lists: ``gpuIds`` and ``locations`` are comma-separated
(``""``: none; a ``-`` prefixed id, RunPod's exclusion, is left out); a GPU id is a
catalog id or display name, or a RunPod pool name (``AMPERE_16``: every catalog type
with 16 GB). ``networkVolumeId: ""`` is no volume; ``flashBootType: FLASHBOOT`` is
``flashboot``. ``gpuIds`` answers the catalog ids the names stood for."""

from __future__ import annotations

from enum import Enum
from typing import Any

import strawberry
from pydantic import ValidationError

from gpuyard.api.graphql.access import require
from gpuyard.api.graphql.context import GqlContext
from gpuyard.api.graphql.errors import from_pydantic, renamed
from gpuyard.api.graphql.inputs import EnvironmentVariableInput
from gpuyard.api.graphql.templates import EnvironmentVariable
from gpuyard.api.rest.schemas.cluster_json import iso
from gpuyard.core.errors import ValidationFailed
from gpuyard.core.roles import Permission
from gpuyard.core.secret_env import masked_env
from gpuyard.services.serverless import endpoints as svc
from gpuyard.services.serverless.endpoint_inputs import CreateEndpoint, UpdateEndpoint
from gpuyard.services.tenancy.projects import ProjectRef
from gpuyard.services.volumes.network_volumes import list_network_volumes
from gpuyard.store.schema.serverless import ServerlessEndpoint

# The use case's fields by the GraphQL input fields that set them (for error paths).
ENDPOINT_NAMES = {
    "name": "name",
    "template_id": "templateId",
    "image": "templateId",
    "gpu_type_ids": "gpuIds",
    "gpu_count": "gpuCount",
    "network_volume_id": "networkVolumeId",
    "locations": "locations",
    "idle_timeout_s": "idleTimeout",
    "scaler_type": "scalerType",
    "scaler_value": "scalerValue",
    "workers_min": "workersMin",
    "workers_max": "workersMax",
    "execution_timeout_ms": "executionTimeoutMs",
    "env": "env",
    "flashboot": "flashBootType",
}


@strawberry.enum(name="FlashBootType")
class FlashBootType(Enum):
    OFF = "OFF"
    FLASHBOOT = "FLASHBOOT"


@strawberry.type(name="EndpointNetworkVolume")
class EndpointNetworkVolume:
    id: str
    data_center_id: str | None


@strawberry.type(name="ServerlessDiscount", description="No discount is offered: always null.")
class ServerlessDiscount:
    discount_factor: float
    type: str
    expiration_date: str | None


@strawberry.type(name="Endpoint", description="A serverless endpoint (the same as /v1/endpoints).")
class Endpoint:
    id: str
    name: str
    template_id: str | None
    gpu_ids: str = strawberry.field(description="Catalog GPU type ids, comma-separated")
    gpu_count: int
    network_volume_id: str | None
    network_volume: EndpointNetworkVolume | None
    locations: str | None = strawberry.field(description="Location ids, comma-separated")
    idle_timeout: int
    scaler_type: str
    scaler_value: int
    workers_min: int
    workers_max: int
    workers_standby: int | None
    execution_timeout_ms: int
    allowed_cuda_versions: str | None
    flash_boot_type: FlashBootType
    env: list[EnvironmentVariable]
    version: int
    status: str
    type: str = strawberry.field(description='"QB": a queue-based endpoint')
    user_id: str | None
    ai_key: str | None = strawberry.field(description="Always null: use an API key")
    created_at: str | None


@strawberry.input(name="EndpointInput")
class EndpointInput:
    id: str | None = strawberry.field(default=None, description="Given: update that endpoint")
    name: str | None = None
    template_id: str | None = None
    gpu_ids: str | None = None
    gpu_count: int | None = None
    network_volume_id: str | None = None
    locations: str | None = None
    idle_timeout: int | None = None
    scaler_type: str | None = None
    scaler_value: int | None = None
    workers_min: int | None = None
    workers_max: int | None = None
    execution_timeout_ms: int | None = None
    env: list[EnvironmentVariableInput | None] | None = None
    flash_boot_type: FlashBootType | None = None
    allowed_cuda_versions: str | None = strawberry.field(
        default=None, description="Accepted; workers are placed by GPU type and location"
    )


@strawberry.input(name="UpdateEndpointTemplateInput")
class UpdateEndpointTemplateInput:
    endpoint_id: str
    template_id: str


def volume_locations(gctx: GqlContext) -> dict[str, str]:
    """The data centre (location) of each network volume the caller can see, by id."""
    return {v.id: v.location for v in list_network_volumes(gctx.ctx, gctx.principal)}


def endpoint_of(
    row: ServerlessEndpoint, user_id: int | None, locations: dict[str, str]
) -> Endpoint:
    """The GraphQL shape of ``row``; ``locations`` (:func:`volume_locations`) gives its
    network volume's data centre."""
    volume = (
        EndpointNetworkVolume(
            id=row.network_volume_id, data_center_id=locations.get(row.network_volume_id)
        )
        if row.network_volume_id
        else None
    )
    return Endpoint(
        id=row.id,
        name=row.name,
        template_id=row.template_id,
        gpu_ids=",".join(row.gpu_type_ids),
        gpu_count=row.gpu_count,
        network_volume_id=row.network_volume_id,
        network_volume=volume,
        locations=",".join(row.locations) or None,
        idle_timeout=row.idle_timeout_s,
        scaler_type=row.scaler_type,
        scaler_value=row.scaler_value,
        workers_min=row.workers_min,
        workers_max=row.workers_max,
        workers_standby=None,
        execution_timeout_ms=row.execution_timeout_ms,
        allowed_cuda_versions=None,
        flash_boot_type=FlashBootType.FLASHBOOT if row.flashboot else FlashBootType.OFF,
        env=[EnvironmentVariable(key=k, value=v) for k, v in masked_env(row.env).items()],
        version=row.version,
        status=row.status,
        type="QB",
        user_id=str(user_id) if user_id else None,
        ai_key=None,
        created_at=iso(row.created_at),
    )


def my_endpoints(gctx: GqlContext) -> list[Endpoint]:
    """The account's live endpoints the caller may use, oldest first."""
    require(gctx, Permission.READ_RESOURCES)
    reads = svc.all_endpoints(gctx.ctx, gctx.principal)
    locations = volume_locations(gctx) if any(r.row.network_volume_id for r in reads) else {}
    return [endpoint_of(r.row, gctx.principal.user_id, locations) for r in reads]


def _listed(text: str) -> list[str]:
    return [p.strip() for p in text.split(",") if p.strip() and not p.strip().startswith("-")]


def _fields(data: EndpointInput) -> dict[str, Any]:
    """The use-case body of ``data``: only the fields given (RunPod's "" as absent)."""
    given: dict[str, Any] = {
        "name": data.name,
        "template_id": data.template_id or None,
        "gpu_count": data.gpu_count,
        "idle_timeout_s": data.idle_timeout,
        "scaler_type": data.scaler_type,
        "scaler_value": data.scaler_value,
        "workers_min": data.workers_min,
        "workers_max": data.workers_max,
        "execution_timeout_ms": data.execution_timeout_ms,
    }
    fields = {k: v for k, v in given.items() if v is not None}
    if data.gpu_ids is not None:
        fields["gpu_type_ids"] = _listed(data.gpu_ids)
    if data.locations is not None:
        fields["locations"] = _listed(data.locations)
    if data.network_volume_id is not None:
        fields["network_volume_id"] = data.network_volume_id or None
    if data.flash_boot_type is not None:
        fields["flashboot"] = data.flash_boot_type == FlashBootType.FLASHBOOT
    if data.env is not None:
        fields["env"] = {
            e.key: {"value": e.value, "secret": True} if e.secret else e.value
            for e in data.env
            if e is not None
        }
    return fields


def save_endpoint(gctx: GqlContext, data: EndpointInput) -> Endpoint:
    """Create an endpoint, or update ``data.id``'s with the fields given."""
    require(gctx, Permission.WRITE_RESOURCES)
    fields = _fields(data)
    try:
        if data.id:
            update = UpdateEndpoint.model_validate(fields)
            read = svc.update_endpoint(gctx.ctx, gctx.principal, ProjectRef(), data.id, update)
        else:
            create = CreateEndpoint.model_validate(fields)
            read = svc.create_endpoint(gctx.ctx, gctx.principal, ProjectRef(), create)
    except ValidationError as exc:
        raise from_pydantic(exc, ENDPOINT_NAMES) from exc
    except ValidationFailed as exc:
        raise renamed(exc, ENDPOINT_NAMES) from exc
    locations = volume_locations(gctx) if read.row.network_volume_id else {}
    return endpoint_of(read.row, gctx.principal.user_id, locations)


def update_endpoint_template(gctx: GqlContext, data: UpdateEndpointTemplateInput) -> Endpoint:
    """Point an endpoint at another template (its image, env and disks for new
    workers)."""
    require(gctx, Permission.WRITE_RESOURCES)
    try:
        update = UpdateEndpoint(template_id=data.template_id)
    except ValidationError as exc:
        raise from_pydantic(exc, ENDPOINT_NAMES) from exc
    read = svc.update_endpoint(gctx.ctx, gctx.principal, ProjectRef(), data.endpoint_id, update)
    locations = volume_locations(gctx) if read.row.network_volume_id else {}
    return endpoint_of(read.row, gctx.principal.user_id, locations)


def delete_endpoint(gctx: GqlContext, endpoint_id: str) -> None:
    """Delete the account's endpoint ``endpoint_id`` (its workers drain and stop)."""
    require(gctx, Permission.WRITE_RESOURCES)
    svc.delete_endpoint(gctx.ctx, gctx.principal, ProjectRef(), endpoint_id)
