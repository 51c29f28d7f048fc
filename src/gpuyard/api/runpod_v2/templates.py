"""``/runpod/v2/templates``: RunPod's Template over gpuyard's cluster templates
(services/clusters/templates.py, the same rows as ``/v1/templates``).

RunPod's fields map onto a template's: ``image`` (docker image), ``args`` (docker
args), ``disk`` (container disk, GB), ``env`` (secret values answered masked, as on
/v1), ``ports`` (``"8888/http"``), ``registry`` (a registry credential's id,
``/runpod/v2/registries``), ``mounts.persistent`` (the volume's size and mount path).
What gpuyard's templates do not hold is answered as what gpuyard does: ``public`` and
``serverless`` are always false (sending true is a 422 saying so), ``category`` is
NVIDIA (another is a 422), ``allowedCudaVersions`` is empty (a list naming versions is
a 422: templates do not restrict CUDA), ``startSsh`` is true (every cluster is reached
over SSH through the gateway) and ``startJupyter`` false (gpuyard starts no notebook
server); both are accepted and ignored on input.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import Depends, Request
from fastapi.responses import JSONResponse, Response
from pydantic import Field, WithJsonSchema, field_validator

from gpuyard.api.runpod_v2.common import (
    V2Body,
    answer,
    documented,
    inputs,
    no_content,
    parse_port,
    port_text,
    renamed,
    v2_router,
)
from gpuyard.api.state import app_state, current_principal
from gpuyard.services.clusters import templates as svc
from gpuyard.services.clusters.template_inputs import CreateTemplate, UpdateTemplate
from gpuyard.services.tenancy.auth import Principal
from gpuyard.services.tenancy.projects import ProjectRef

router = v2_router()

# gpuyard's input field -> the v2 member it comes from (for errors).
NAMES = {
    "docker_image": "image",
    "docker_args": "args",
    "container_disk_gb": "disk",
    "container_registry_auth_id": "registry",
    "volume_gb": "mounts.persistent.size",
    "volume_mount_path": "mounts.persistent.path",
    "is_public": "public",
}


class PersistentMount(V2Body):
    size: int = Field(ge=0, le=1048576, strict=True, description="The volume, in GB")
    path: str = Field(
        min_length=1,
        max_length=255,
        description="Where it is mounted (absolute)",
        json_schema_extra={"pattern": "^/"},
    )


class TemplateMounts(V2Body):
    persistent: PersistentMount | None = None


def _ports(ports: list[str] | None) -> list[str] | None:
    for p in ports or []:
        parse_port(p)
    return ports


def _no_cuda(versions: list[str] | None) -> list[str] | None:
    if versions:
        raise ValueError("templates do not restrict CUDA versions here: send [] or leave it out")
    return versions


def _not_true(what: str) -> Any:
    def check(value: bool | None) -> bool | None:
        if value:
            raise ValueError(f"{what} templates are not offered: a template is its account's own")
        return value

    return check


# What gpuyard's templates never are (public, serverless): taken, refused when true
# with a problem saying why; the document says false.
OnlyFalse = Annotated[
    bool | None, WithJsonSchema({"anyOf": [{"type": "boolean", "enum": [False]}, {"type": "null"}]})
]


class _TemplateFields(V2Body):
    image: str | None = Field(default=None, min_length=1, max_length=512)
    args: str | None = Field(default=None, max_length=8192)
    disk: int | None = Field(default=None, ge=1, le=65536, strict=True)
    env: dict[str, str] | None = None
    ports: list[str] | None = Field(default=None, max_length=64)
    registry: str | None = Field(default=None, min_length=1, max_length=100)
    mounts: TemplateMounts | None = None
    allowedCudaVersions: list[str] | None = Field(
        default=None, json_schema_extra={"maxItems": 0}, description="Only empty"
    )
    category: Literal["NVIDIA"] | None = Field(
        default=None, description="NVIDIA only: gpuyard's GPU types"
    )
    public: OnlyFalse = Field(default=None, strict=True, description="Only false")
    serverless: OnlyFalse = Field(default=None, strict=True, description="Only false")
    startJupyter: bool | None = Field(default=None, strict=True, description="Accepted, ignored")
    startSsh: bool | None = Field(
        default=None, strict=True, description="Accepted, ignored: always SSH"
    )

    _v_ports = field_validator("ports")(_ports)
    _v_cuda = field_validator("allowedCudaVersions")(_no_cuda)
    _v_public = field_validator("public")(_not_true("public"))
    _v_serverless = field_validator("serverless")(_not_true("serverless"))

    def gpuyard_fields(self) -> dict[str, Any]:
        """The fields sent, as a gpuyard template body's."""
        sent = self.model_fields_set
        out: dict[str, Any] = {}
        for v2, ours in (("image", "docker_image"), ("args", "docker_args")):
            if v2 in sent and getattr(self, v2) is not None:
                out[ours] = getattr(self, v2)
        if "disk" in sent and self.disk is not None:
            out["container_disk_gb"] = self.disk
        if "env" in sent and self.env is not None:
            out["env"] = dict(self.env)
        if "ports" in sent and self.ports is not None:
            out["ports"] = [parse_port(p) for p in self.ports]
        if "registry" in sent:
            out["container_registry_auth_id"] = self.registry
        if "mounts" in sent and self.mounts is not None:
            persistent = self.mounts.persistent
            out["volume_gb"] = persistent.size if persistent else 0
            if persistent is not None:
                out["volume_mount_path"] = persistent.path
        return out


class CreateTemplateRequest(_TemplateFields):
    name: str = Field(min_length=1, max_length=200)
    image: str = Field(min_length=1, max_length=512)


class UpdateTemplateRequest(_TemplateFields):
    name: str | None = Field(default=None, min_length=1, max_length=200)


def template_view(row: Any) -> dict[str, Any]:
    """RunPod's Template of a stored template (secret env values masked)."""
    v = svc.template_view(row)
    mounts: dict[str, Any] = {}
    if v["volume_gb"]:
        mounts["persistent"] = {"size": v["volume_gb"], "path": v["volume_mount_path"]}
    return {
        "id": v["id"],
        "name": v["name"],
        "image": v["docker_image"],
        "args": v["docker_args"],
        "disk": v["container_disk_gb"],
        "env": v["env"],
        "ports": [port_text(p) for p in v["ports"]],
        "registry": v["container_registry_auth_id"],
        "mounts": mounts,
        "serverless": False,
        "public": False,
        "category": "NVIDIA",
        "startSsh": True,
        "startJupyter": False,
        "allowedCudaVersions": [],
    }


@router.get("/templates", responses=documented("ListTemplatesResponse: {templates}"))
def list_templates(
    request: Request, principal: Principal = Depends(current_principal)
) -> JSONResponse:
    """The account's templates the caller may use, oldest first."""
    rows = svc.all_templates(app_state(request).ctx, principal)
    return answer({"templates": [template_view(r) for r in rows]})


@router.post("/templates", status_code=201, responses=documented("Template", 201))
def create_template(
    body: CreateTemplateRequest, request: Request, principal: Principal = Depends(current_principal)
) -> JSONResponse:
    """A new template in the account's default project. Names are unique in the
    account (409 TEMPLATE_EXISTS)."""
    data = {"name": body.name, **body.gpuyard_fields()}
    created = inputs(CreateTemplate, data, NAMES)
    with renamed(NAMES):
        row = svc.create_template(app_state(request).ctx, principal, ProjectRef(), created)
    return answer(template_view(row), 201)


@router.get("/templates/{id}", responses=documented("Template"))
def get_template(
    id: str, request: Request, principal: Principal = Depends(current_principal)
) -> JSONResponse:
    row = svc.show_template(app_state(request).ctx, principal, ProjectRef(), id)
    return answer(template_view(row))


@router.patch("/templates/{id}", responses=documented("Template"))
def update_template(
    id: str,
    body: UpdateTemplateRequest,
    request: Request,
    principal: Principal = Depends(current_principal),
) -> JSONResponse:
    """Change the fields sent; ``env`` replaces the map (a masked value sent back keeps
    its secret); ``registry: null`` clears it."""
    data = body.gpuyard_fields()
    if body.name is not None:
        data["name"] = body.name
    changes = inputs(UpdateTemplate, data, NAMES)
    with renamed(NAMES):
        row = svc.update_template(app_state(request).ctx, principal, ProjectRef(), id, changes)
    return answer(template_view(row))


@router.delete("/templates/{id}", status_code=204, responses=documented("Deleted", 204))
def delete_template(
    id: str, request: Request, principal: Principal = Depends(current_principal)
) -> Response:
    """Delete a template; clusters made from it keep running."""
    svc.delete_template(app_state(request).ctx, principal, ProjectRef(), id)
    return no_content()
