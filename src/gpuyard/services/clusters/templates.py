"""Cluster templates: saved configurations new clusters are created from (RunPod's pod
templates). A template belongs to its account and to one of its projects; only that
account ever sees it (no public templates), and its name is unique there. Secret env
values are sealed as a cluster's are (services/tenancy/secrets.py) and every answer
shows them masked.

A template's ``container_registry_auth_id`` must be one of the account's registry
credentials (checked at each save); a cluster created from the template is pulled
with them unless its create names its own ``registry_auth_id`` (null: none).

A template's ``start_script`` is what a cluster made from it runs when neither the
create nor the template gives docker args: ``/bin/sh -c <script>`` becomes the
cluster's command (stored as its ``docker_args``, so reads show what runs). With
docker args the script is kept on the template only (RunPod's templates carry the
field without documenting a use; gpuyard gives it this one).

The ``ctx`` use cases open their own transaction and check the caller's permission;
``template_for_create`` and ``with_template`` run inside a cluster create's."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select, tuple_
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from gpuyard.core import cursors
from gpuyard.core.errors import GpuyardError, NotFound, ValidationFailed
from gpuyard.core.ids import new_template_id
from gpuyard.core.image_refs import check_image
from gpuyard.core.input_rules import MAX_ENV_VARS
from gpuyard.core.models import PortSpec
from gpuyard.core.secret_env import masked_env
from gpuyard.services.access.resource_util import iso
from gpuyard.services.clusters.config import ports_json
from gpuyard.services.clusters.requests import CreateCluster
from gpuyard.services.clusters.template_inputs import CreateTemplate, UpdateTemplate
from gpuyard.services.context import Context
from gpuyard.services.tenancy.auth import Principal
from gpuyard.services.tenancy.projects import (
    ProjectRef,
    ResourceScope,
    project_of_ref,
    resource_scope,
)
from gpuyard.services.tenancy.registry_auths import checked_auth_id
from gpuyard.services.tenancy.secrets import seal_env, secret_box, update_env
from gpuyard.store.schema import ClusterTemplate

TEMPLATES_LIST = "templates"
TEMPLATE_KEY: cursors.KeyShape = ("time", "str")
DEFAULT_PER_PAGE = 50
MAX_PER_PAGE = 200
MAX_TEMPLATE_ID_CHARS = 20


class TemplateNotFound(NotFound):
    code = "TEMPLATE_NOT_FOUND"


class TemplateExists(GpuyardError):
    """Template names are unique in an account; the holder's id is in ``details``."""

    code = "TEMPLATE_EXISTS"
    http_status = 409


@dataclass(frozen=True)
class TemplatePage:
    """One page of templates, the total matching and the next page's cursor (None on
    the last)."""

    templates: list[ClusterTemplate]
    total: int
    next_cursor: str | None


def template_view(row: ClusterTemplate) -> dict[str, Any]:
    """The API shape of a template: secret env values masked."""
    return {
        "id": row.id,
        "name": row.name,
        "project_id": row.project_id,
        "docker_image": row.image,
        "docker_args": row.docker_args,
        "docker_entrypoint": (
            list(row.docker_entrypoint) if row.docker_entrypoint is not None else None
        ),
        "start_script": row.start_script,
        "env": masked_env(row.env),
        "ports": list(row.ports),
        "container_disk_gb": row.container_disk_gb,
        "volume_gb": row.volume_gb,
        "volume_mount_path": row.volume_mount_path,
        "readme": row.readme,
        "container_registry_auth_id": row.container_registry_auth_id,
        "is_public": False,
        "is_serverless": row.is_serverless,
        "created_at": iso(row.created_at),
        "updated_at": iso(row.updated_at),
    }


# ---------------------------------------------------------------- finders


def _missing(template_id: str) -> TemplateNotFound:
    return TemplateNotFound(f"template {template_id} not found", {"template_id": template_id})


def _find(session: Session, scope: ResourceScope, template_id: str) -> ClusterTemplate:
    """One template in ``scope``. Raises TemplateNotFound, the same for an unknown id
    and another account's (or another project's) template."""
    if not template_id or len(template_id) > MAX_TEMPLATE_ID_CHARS:
        raise _missing(template_id[:MAX_TEMPLATE_ID_CHARS])
    row = session.scalar(
        select(ClusterTemplate).where(
            ClusterTemplate.id == template_id, ClusterTemplate.account_id == scope.account_id
        )
    )
    if row is None or not scope.covers(row.project_id):
        raise _missing(template_id)
    return row


def _find_by_name(session: Session, scope: ResourceScope, name: str) -> ClusterTemplate:
    row = session.scalar(
        select(ClusterTemplate).where(
            ClusterTemplate.account_id == scope.account_id, ClusterTemplate.name == name
        )
    )
    if row is None or not scope.covers(row.project_id):
        raise TemplateNotFound(f"template {name!r} not found", {"template_name": name})
    return row


def _refuse_taken(session: Session, account_id: int, name: str, own_id: str | None) -> None:
    holder = session.scalar(
        select(ClusterTemplate.id).where(
            ClusterTemplate.account_id == account_id, ClusterTemplate.name == name
        )
    )
    if holder is not None and holder != own_id:
        raise TemplateExists(
            f"a template named {name!r} already exists", {"field": "name", "template_id": holder}
        )


def _flush_named(session: Session, row: ClusterTemplate) -> None:
    """Write ``row`` in a savepoint: a concurrent save of the same name (the unique key)
    ends as TemplateExists, not as an aborted transaction."""
    try:
        with session.begin_nested():
            session.add(row)
    except IntegrityError:
        _refuse_taken(session, row.account_id, row.name, None)
        raise


def _auth_id(session: Session, account_id: int, auth_id: str | None) -> str | None:
    """A template's registry credentials, checked: one of ``account_id``'s (its id as
    text), or None. Raises ValidationFailed naming ``container_registry_auth_id``."""
    if auth_id is None:
        return None
    return str(checked_auth_id(session, account_id, auth_id, "container_registry_auth_id"))


# ---------------------------------------------------------------- use cases


def create_template(
    ctx: Context, principal: Principal, ref: ProjectRef, body: CreateTemplate
) -> ClusterTemplate:
    """A new template of ``ref``'s project (default: the default project). Needs the
    write permission. Raises ProjectNotFound / Forbidden, TemplateExists (409)."""
    principal.require_write()
    # The image a cluster would pull: only from registries the operator allows.
    check_image(body.docker_image, ctx.settings.registry_policy, "docker_image")
    box = secret_box(ctx.settings)
    now = ctx.clock.now()
    with ctx.transaction() as session:
        project = project_of_ref(session, principal, ref)
        _refuse_taken(session, project.account_id, body.name, None)
        row = ClusterTemplate(
            id=new_template_id(),
            account_id=project.account_id,
            project_id=project.id,
            name=body.name,
            image=body.docker_image,
            env=seal_env(box, body.env, body.secret_env),
            ports=ports_json(body.ports),
            container_disk_gb=body.container_disk_gb,
            volume_gb=body.volume_gb,
            volume_mount_path=body.volume_mount_path,
            docker_args=body.docker_args,
            docker_entrypoint=body.docker_entrypoint,
            start_script=body.start_script,
            readme=body.readme,
            container_registry_auth_id=_auth_id(
                session, project.account_id, body.container_registry_auth_id
            ),
            is_serverless=body.is_serverless,
            created_at=now,
            updated_at=now,
        )
        _flush_named(session, row)
        return row


def template_page(
    ctx: Context,
    principal: Principal,
    ref: ProjectRef,
    *,
    per_page: int = DEFAULT_PER_PAGE,
    cursor: str | None = None,
) -> TemplatePage:
    """The acting account's templates the caller may use (only ``ref.project_id``'s
    when it names one), oldest first. With ``cursor`` (an earlier page's
    ``next_cursor`` with the same filters) the rows after it. Raises ValidationFailed
    naming ``cursor`` for a bad one, ProjectNotFound / Forbidden."""
    cursor = cursor or None
    with ctx.read() as session:
        scope = resource_scope(session, principal, ref)
        bound: dict[str, cursors.FilterValue] = {
            "account": scope.account_id,
            "project_id": scope.project_id,
        }
        after = cursors.decode(cursor, TEMPLATES_LIST, bound, TEMPLATE_KEY) if cursor else None
        q = select(ClusterTemplate).where(ClusterTemplate.account_id == scope.account_id)
        if scope.project_id is not None:
            q = q.where(ClusterTemplate.project_id == scope.project_id)
        if scope.allowed is not None:
            q = q.where(ClusterTemplate.project_id.in_(sorted(scope.allowed)))
        total = session.scalar(select(func.count()).select_from(q.subquery())) or 0
        if after is not None:
            q = q.where(tuple_(ClusterTemplate.created_at, ClusterTemplate.id) > tuple_(*after))
        q = q.order_by(ClusterTemplate.created_at, ClusterTemplate.id).limit(per_page + 1)
        rows = list(session.scalars(q))
    page = rows[:per_page]
    next_cursor = None
    if len(rows) > per_page:
        last = page[-1]
        next_cursor = cursors.encode(TEMPLATES_LIST, bound, (last.created_at, last.id))
    return TemplatePage(page, int(total), next_cursor)


def all_templates(ctx: Context, principal: Principal) -> list[ClusterTemplate]:
    """Every template of the caller's account it may use, oldest first (GraphQL
    ``myself.podTemplates``)."""
    with ctx.read() as session:
        scope = resource_scope(session, principal, ProjectRef())
        q = select(ClusterTemplate).where(ClusterTemplate.account_id == scope.account_id)
        if scope.allowed is not None:
            q = q.where(ClusterTemplate.project_id.in_(sorted(scope.allowed)))
        return list(session.scalars(q.order_by(ClusterTemplate.created_at, ClusterTemplate.id)))


def show_template(
    ctx: Context, principal: Principal, ref: ProjectRef, template_id: str
) -> ClusterTemplate:
    """One template of the acting account (of ``ref.project_id`` when given). Raises
    TemplateNotFound, ProjectNotFound / Forbidden."""
    with ctx.read() as session:
        return _find(session, resource_scope(session, principal, ref), template_id)


def update_template(
    ctx: Context,
    principal: Principal,
    ref: ProjectRef,
    template_id: str,
    body: UpdateTemplate,
) -> ClusterTemplate:
    """Apply ``body``'s fields to a template (see UpdateTemplate). Clusters made from
    it keep what they were made with. Needs the write permission. Raises as
    show_template, Forbidden, TemplateExists (409)."""
    principal.require_write()
    if body.docker_image is not None:
        check_image(body.docker_image, ctx.settings.registry_policy, "docker_image")
    box = secret_box(ctx.settings)
    with ctx.transaction() as session:
        row = _find(session, resource_scope(session, principal, ref), template_id)
        sent = body.model_fields_set
        if body.name is not None and body.name != row.name:
            _refuse_taken(session, row.account_id, body.name, row.id)
            row.name = body.name
        if body.docker_image is not None:
            row.image = body.docker_image
        if body.env is not None:
            kept = {k: v for k, v in row.env.items() if k in body.env}
            row.env = update_env(box, kept, dict(body.env), body.secret_env)
        if body.ports is not None:
            row.ports = ports_json(body.ports)
        for field in ("docker_args", "start_script", "readme", "container_disk_gb"):
            if getattr(body, field) is not None:
                setattr(row, field, getattr(body, field))
        if body.volume_gb is not None:
            row.volume_gb = body.volume_gb
        if body.volume_mount_path is not None:
            row.volume_mount_path = body.volume_mount_path
        if "container_registry_auth_id" in sent:
            row.container_registry_auth_id = _auth_id(
                session, row.account_id, body.container_registry_auth_id
            )
        if body.is_serverless is not None:
            row.is_serverless = body.is_serverless
        if "docker_entrypoint" in sent:
            row.docker_entrypoint = body.docker_entrypoint
        row.updated_at = ctx.clock.now()
        try:
            with session.begin_nested():
                session.flush()
        except IntegrityError:
            _refuse_taken(session, row.account_id, row.name, row.id)
            raise
        return row


def delete_template(ctx: Context, principal: Principal, ref: ProjectRef, template_id: str) -> None:
    """Delete a template; clusters made from it keep running and keep its id. Needs
    the write permission. Raises as show_template, Forbidden."""
    principal.require_write()
    with ctx.transaction() as session:
        row = _find(session, resource_scope(session, principal, ref), template_id)
        session.delete(row)


def delete_template_named(ctx: Context, principal: Principal, name: str) -> str:
    """Delete the acting account's template called ``name`` (GraphQL
    ``deleteTemplate``); answers its id. Raises TemplateNotFound, Forbidden."""
    principal.require_write()
    with ctx.transaction() as session:
        row = _find_by_name(session, resource_scope(session, principal, ProjectRef()), name)
        session.delete(row)
        return row.id


# ---------------------------------------------------------------- cluster creates


def template_for_create(
    session: Session, principal: Principal, account_id: int, template_id: str
) -> ClusterTemplate:
    """The template a cluster create names, inside its transaction: one of
    ``account_id`` (the new cluster's project's account) the caller may use. Raises
    ValidationFailed naming ``template_id`` otherwise (another account's template
    reads as unknown)."""
    allowed = principal.project_ids if account_id == principal.account_id else None
    try:
        return _find(session, ResourceScope(account_id, None, allowed), template_id)
    except TemplateNotFound as exc:
        raise ValidationFailed("template_id", exc.message, {"template_id": template_id}) from exc


# What a template fills in a create body when the request leaves it out.
_FILLED = ("docker_args", "container_disk_gb", "volume_gb", "volume_mount_path")


def with_template(body: CreateCluster, template: ClusterTemplate) -> CreateCluster:
    """``body`` with what it left out taken from ``template`` (image, docker args and
    entrypoint, ports, disk sizes, mount path, registry credentials); what the request
    sent wins. With no docker args from either, the template's start script is the
    command (``/bin/sh -c``). Env is merged by the caller (the template's values are
    stored sealed already: ``template_env``)."""
    sent = body.model_fields_set
    fill: dict[str, Any] = {f: getattr(template, f) for f in _FILLED if f not in sent}
    if not body.docker_image:
        fill["docker_image"] = template.image
    if "ports" not in sent:
        fill["ports"] = [PortSpec.model_validate(p) for p in template.ports]
    if "registry_auth_id" not in sent and template.container_registry_auth_id:
        # Checked by the create (with the other references): a stored id that is no
        # longer the account's is refused there, not dropped.
        auth = template.container_registry_auth_id
        fill["registry_auth_id"] = int(auth) if auth.isdigit() else auth
    args = fill.get("docker_args", body.docker_args)
    if not args.strip() and template.start_script.strip():
        fill["docker_args"] = start_command(template.start_script)
    if "docker_entrypoint" not in sent and template.docker_entrypoint is not None:
        fill["docker_entrypoint"] = list(template.docker_entrypoint)
    return body.model_copy(update=fill)


def start_command(script: str) -> str:
    """The docker args that run ``script`` with the image's shell."""
    return shlex.join(["/bin/sh", "-c", script])


def merged_env(template: ClusterTemplate | None, stored: dict[str, str]) -> dict[str, str]:
    """A new cluster's stored env: the template's (its secret values sealed already)
    with the request's ``stored`` (sealed by the caller) over it. Raises
    ValidationFailed on ``env`` when the two hold more variables than a cluster may."""
    if template is None:
        return stored
    env = {**template.env, **stored}
    if len(env) > MAX_ENV_VARS:
        raise ValidationFailed(
            "env",
            f"{len(env)} environment variables with the template's; at most {MAX_ENV_VARS}",
        )
    return env
