# Strawberry's field decorators are typed as returning Any; the resolvers are typed.
# mypy: disable-error-code="untyped-decorator"
"""RunPod's pod templates on the GraphQL API: the ``PodTemplate`` type
(``myself { podTemplates }``), ``saveTemplate`` (create; update when ``input.id`` is
given) and ``deleteTemplate`` (by name, as RunPod deletes). They answer through the
same use cases as ``/v1/templates`` (services/clusters/templates.py); reads need
READ_RESOURCES, changes WRITE_RESOURCES (api/graphql/access.py)."""

from __future__ import annotations

from typing import Any

import strawberry
from pydantic import ValidationError

from gpuyard.api.graphql.access import require
from gpuyard.api.graphql.context import GqlContext
from gpuyard.api.graphql.errors import from_pydantic, renamed
from gpuyard.api.graphql.inputs import EnvironmentVariableInput, parse_ports
from gpuyard.core.errors import ValidationFailed
from gpuyard.core.roles import Permission
from gpuyard.core.secret_env import masked_env
from gpuyard.services.clusters import templates as svc
from gpuyard.services.clusters.template_inputs import CreateTemplate, UpdateTemplate
from gpuyard.services.tenancy.projects import ProjectRef
from gpuyard.store.schema import ClusterTemplate

# The use case's fields by the GraphQL input fields that set them (for error paths).
TEMPLATE_NAMES = {
    "name": "name",
    "docker_image": "imageName",
    "docker_args": "dockerArgs",
    "start_script": "startScript",
    "env": "env",
    "ports": "ports",
    "container_disk_gb": "containerDiskInGb",
    "volume_gb": "volumeInGb",
    "volume_mount_path": "volumeMountPath",
    "readme": "readme",
    "container_registry_auth_id": "containerRegistryAuthId",
    "is_public": "isPublic",
    "is_serverless": "isServerless",
}


@strawberry.type(name="EnvironmentVariable")
class EnvironmentVariable:
    key: str
    value: str = strawberry.field(description='Secret values show as "********"')


@strawberry.type(name="PodTemplate", description="A saved configuration pods are created from.")
class PodTemplate:
    id: str
    name: str
    image_name: str
    docker_args: str
    start_script: str | None
    container_disk_in_gb: int
    volume_in_gb: int
    volume_mount_path: str
    ports: str = strawberry.field(description='"8888/http,22/tcp"')
    env: list[EnvironmentVariable]
    readme: str
    is_public: bool = strawberry.field(description="Always false: templates are private")
    is_serverless: bool = strawberry.field(description="A template for serverless endpoints")
    container_registry_auth_id: str | None


@strawberry.input(name="SaveTemplateInput")
class SaveTemplateInput:
    id: str | None = strawberry.field(default=None, description="Given: update that template")
    name: str | None = None
    image_name: str | None = None
    docker_args: str | None = None
    start_script: str | None = None
    container_disk_in_gb: int | None = None
    volume_in_gb: int | None = None
    volume_mount_path: str | None = None
    ports: str | None = None
    env: list[EnvironmentVariableInput | None] | None = None
    readme: str | None = None
    is_public: bool | None = strawberry.field(default=None, description="Only false")
    is_serverless: bool | None = strawberry.field(
        default=None, description="A template for serverless endpoints (stored)"
    )
    container_registry_auth_id: str | None = None
    start_ssh: bool | None = None
    start_jupyter: bool | None = None


def template_of(row: ClusterTemplate) -> PodTemplate:
    return PodTemplate(
        id=row.id,
        name=row.name,
        image_name=row.image,
        docker_args=row.docker_args,
        start_script=row.start_script or None,
        container_disk_in_gb=row.container_disk_gb,
        volume_in_gb=row.volume_gb,
        volume_mount_path=row.volume_mount_path,
        ports=",".join(f"{p['internal_port']}/{p['protocol']}" for p in row.ports),
        env=[EnvironmentVariable(key=k, value=v) for k, v in masked_env(row.env).items()],
        readme=row.readme,
        is_public=False,
        is_serverless=row.is_serverless,
        container_registry_auth_id=row.container_registry_auth_id,
    )


def pod_templates(gctx: GqlContext) -> list[PodTemplate]:
    """The account's templates the caller may use, oldest first."""
    require(gctx, Permission.READ_RESOURCES)
    return [template_of(r) for r in svc.all_templates(gctx.ctx, gctx.principal)]


def _fields(data: SaveTemplateInput) -> dict[str, Any]:
    """The use-case body of ``data``: only the fields given ("" as absent for the
    registry credential, as runpod-python sends it)."""
    given: dict[str, Any] = {
        "name": data.name,
        "docker_image": data.image_name,
        "docker_args": data.docker_args,
        "start_script": data.start_script,
        "container_disk_gb": data.container_disk_in_gb,
        "volume_gb": data.volume_in_gb,
        "volume_mount_path": data.volume_mount_path,
        "readme": data.readme,
        "container_registry_auth_id": data.container_registry_auth_id or None,
        "is_public": data.is_public,
        "is_serverless": data.is_serverless,
    }
    fields = {k: v for k, v in given.items() if v is not None}
    if data.ports is not None:
        fields["ports"] = parse_ports(data.ports)
    if data.env is not None:
        fields["env"] = {
            e.key: {"value": e.value, "secret": True} if e.secret else e.value
            for e in data.env
            if e is not None
        }
    return fields


def save_template(gctx: GqlContext, data: SaveTemplateInput) -> PodTemplate:
    """Create a template, or update ``data.id``'s with the fields given."""
    require(gctx, Permission.WRITE_RESOURCES)
    fields = _fields(data)
    try:
        if data.id:
            update = UpdateTemplate.model_validate(fields)
            row = svc.update_template(gctx.ctx, gctx.principal, ProjectRef(), data.id, update)
        else:
            create = CreateTemplate.model_validate(fields)
            row = svc.create_template(gctx.ctx, gctx.principal, ProjectRef(), create)
    except ValidationError as exc:
        raise from_pydantic(exc, TEMPLATE_NAMES) from exc
    except ValidationFailed as exc:
        raise renamed(exc, TEMPLATE_NAMES) from exc
    return template_of(row)


def delete_template(gctx: GqlContext, template_name: str) -> None:
    """Delete the account's template called ``template_name``."""
    require(gctx, Permission.WRITE_RESOURCES)
    svc.delete_template_named(gctx.ctx, gctx.principal, template_name)
