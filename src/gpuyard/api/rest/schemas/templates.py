"""OpenAPI models of ``/v1/templates``' answers (the bodies are
services/clusters/template_inputs.py's). Like every answer model, unknown fields are
forbidden and the API tests validate real answers against them."""

from __future__ import annotations

from typing import Literal

from gpuyard.api.rest.schemas.resources import _envelope
from gpuyard.api.rest.schemas.responses import Pagination, Port, StrictOut


class Template(StrictOut):
    id: str
    name: str
    project_id: int
    docker_image: str
    docker_args: str
    # The ENTRYPOINT its clusters get (null: the image's own; []: none).
    docker_entrypoint: list[str] | None
    start_script: str
    # Secret values show as the mask; sending the mask back keeps them.
    env: dict[str, str]
    ports: list[Port]
    container_disk_gb: int
    volume_gb: int
    volume_mount_path: str
    readme: str
    container_registry_auth_id: str | None
    is_public: Literal[False]
    is_serverless: bool
    created_at: str | None
    updated_at: str | None


class TemplateList(StrictOut):
    templates: list[Template]
    pagination: Pagination


class TemplateDeleted(StrictOut):
    id: str
    deleted: Literal[True]


TemplateEnvelope = _envelope("TemplateEnvelope", Template)
TemplateListEnvelope = _envelope("TemplateListEnvelope", TemplateList)
TemplateDeletedEnvelope = _envelope("TemplateDeletedEnvelope", TemplateDeleted)
