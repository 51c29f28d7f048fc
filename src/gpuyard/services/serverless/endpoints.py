"""Serverless endpoints as a resource: create, read, change and delete them.

An endpoint belongs to its account and to one of its projects; another account's (or,
for a caller restricted to some projects, another project's) endpoint reads as absent.
Names are unique among an account's live endpoints (409 ENDPOINT_EXISTS).

- **Images.** ``image`` names the workers' image directly, or ``template_id`` one of
  the account's templates, whose image, env, disk sizes and mount path fill what the
  body leaves out (another account's template is TEMPLATE_NOT_FOUND, 404). The image
  must come from a registry the operator allows.
- **GPU types.** ``gpu_type_ids`` are catalog ids or display names, or RunPod's pool
  names (``AMPERE_16``, ``ADA_24``, ``HOPPER_141``, …: ``FAMILY_<GB>``), which stand
  for every catalog type with that much memory; stored as catalog ids. Unknown names
  are VALIDATION_ERROR naming ``gpu_type_ids``.
- **Changes** bump ``version``: workers started afterwards get the new settings;
  running workers finish their jobs on the settings they started with.
- **Delete** marks the endpoint ``deleting``: it takes no new jobs, the reconciler
  drains and stops its workers and then marks it ``deleted``. From that moment the
  endpoint is absent to every read, and its name is free: the row is renamed
  ``<name>~deleted~<id>`` (names are unique per account in the store).

The ``ctx`` use cases open their own transaction and check the caller's permission;
``live_endpoint`` runs inside its caller's."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select, tuple_
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from gpuyard.core import cursors
from gpuyard.core.errors import GpuyardError, NotFound, ValidationFailed
from gpuyard.core.ids import new_endpoint_id
from gpuyard.core.image_refs import check_image
from gpuyard.services.catalog.gpu_types import find_gpu_type
from gpuyard.services.catalog.locations import check_location
from gpuyard.services.clusters import templates as tpl
from gpuyard.services.context import Context
from gpuyard.services.serverless.endpoint_inputs import CreateEndpoint, UpdateEndpoint
from gpuyard.services.serverless.endpoint_views import EndpointCounts, endpoint_counts
from gpuyard.services.tenancy.audit import record_audit
from gpuyard.services.tenancy.auth import Principal
from gpuyard.services.tenancy.projects import (
    ProjectRef,
    ResourceScope,
    project_of_ref,
    resource_scope,
)
from gpuyard.services.tenancy.secrets import SecretBox, seal_env, secret_box, update_env
from gpuyard.services.volumes.network_volumes import load_network_volume
from gpuyard.store.schema import ClusterTemplate, GpuType
from gpuyard.store.schema.serverless import ServerlessEndpoint

ENDPOINTS_LIST = "endpoints"
ENDPOINT_KEY: cursors.KeyShape = ("time", "str")
DEFAULT_PER_PAGE = 50
MAX_PER_PAGE = 200
MAX_ENDPOINT_ID_CHARS = 14
# Statuses of an endpoint that is gone for its account (see the module docstring).
GONE = ("deleting", "deleted")
DELETED_MARK = "~deleted~"
DEFAULT_CONTAINER_DISK_GB = 10
DEFAULT_VOLUME_GB = 0
DEFAULT_MOUNT_PATH = "/runpod-volume"
# RunPod's GPU pools: a family and the memory in GB (AMPERE_16, ADA_48_PRO, HOPPER_141).
_POOL = re.compile(r"^[A-Z]+_(\d{1,4})(_PRO)?$")


class EndpointNotFound(NotFound):
    code = "ENDPOINT_NOT_FOUND"


class EndpointExists(GpuyardError):
    """Endpoint names are unique among an account's live endpoints; the holder's id is
    in ``details``."""

    code = "ENDPOINT_EXISTS"
    http_status = 409


@dataclass(frozen=True)
class EndpointRead:
    """An endpoint and what its workers and jobs are doing now."""

    row: ServerlessEndpoint
    counts: EndpointCounts


@dataclass(frozen=True)
class EndpointPage:
    """One page of endpoints, the total matching and the next page's cursor (None on
    the last)."""

    endpoints: list[EndpointRead]
    total: int
    next_cursor: str | None


# ---------------------------------------------------------------- finders


def _missing(endpoint_id: str) -> EndpointNotFound:
    return EndpointNotFound(f"endpoint {endpoint_id} not found", {"endpoint_id": endpoint_id})


def _find(
    session: Session,
    scope: ResourceScope,
    endpoint_id: str,
    *,
    lock: bool = False,
    draining_ok: bool = False,
) -> ServerlessEndpoint:
    """One live endpoint in ``scope`` (``draining_ok``: or one being deleted, whose jobs
    still run). Raises EndpointNotFound, the same for an unknown id, a deleted endpoint
    and another account's (or another project's)."""
    if not endpoint_id or len(endpoint_id) > MAX_ENDPOINT_ID_CHARS:
        raise _missing(endpoint_id[:MAX_ENDPOINT_ID_CHARS])
    q = select(ServerlessEndpoint).where(
        ServerlessEndpoint.id == endpoint_id,
        ServerlessEndpoint.account_id == scope.account_id,
    )
    if lock:
        q = q.with_for_update()
    row = session.scalar(q)
    if row is None or not scope.covers(row.project_id):
        raise _missing(endpoint_id)
    if row.status == "deleted" or (row.status in GONE and not draining_ok):
        raise _missing(endpoint_id)
    return row


def live_endpoint(
    session: Session,
    principal: Principal,
    endpoint_id: str,
    ref: ProjectRef | None = None,
    *,
    draining_ok: bool = False,
) -> ServerlessEndpoint:
    """The caller's live endpoint ``endpoint_id`` (of the acting account, in a project
    it may use; ``ref``: the request's project and ``active_iam``), for the job API;
    ``draining_ok``: one being deleted too (its jobs may still be read, cancelled and
    purged; it takes no new ones). Raises EndpointNotFound otherwise, whatever the
    reason. Runs inside the caller's transaction."""
    scope = resource_scope(session, principal, ref or ProjectRef())
    return _find(session, scope, endpoint_id, draining_ok=draining_ok)


def _refuse_taken(session: Session, account_id: int, name: str, own_id: str | None) -> None:
    holder = session.scalar(
        select(ServerlessEndpoint.id).where(
            ServerlessEndpoint.account_id == account_id, ServerlessEndpoint.name == name
        )
    )
    if holder is not None and holder != own_id:
        raise EndpointExists(
            f"an endpoint named {name!r} already exists", {"field": "name", "endpoint_id": holder}
        )


def _flush(session: Session, row: ServerlessEndpoint, *, new: bool) -> None:
    """Write ``row`` in a savepoint: a concurrent save of the same name (the unique
    key) ends as EndpointExists, not as an aborted transaction."""
    try:
        with session.begin_nested():
            if new:
                session.add(row)
            else:
                session.flush()
    except IntegrityError:
        _refuse_taken(session, row.account_id, row.name, None if new else row.id)
        raise


def _template(
    session: Session, principal: Principal, account_id: int, template_id: str
) -> ClusterTemplate:
    """The account's template ``template_id``; TemplateNotFound (404) otherwise."""
    try:
        return tpl.template_for_create(session, principal, account_id, template_id)
    except ValidationFailed as exc:
        raise tpl.TemplateNotFound(
            f"template {template_id} not found", {"template_id": template_id}
        ) from exc


def gpu_type_ids(session: Session, names: list[str]) -> list[str]:
    """The catalog ids ``names`` stand for (catalog ids, display names, or RunPod pool
    names: every type with the pool's memory), each once in the order first named.
    Raises ValidationFailed naming ``gpu_type_ids`` for a name that matches nothing.
    Runs inside the caller's transaction."""
    out: list[str] = []
    for name in names:
        found = find_gpu_type(session, name)
        if found is not None:
            out.append(found.id)
            continue
        pool = _POOL.match(name.strip().upper())
        ids = (
            list(
                session.scalars(
                    select(GpuType.id)
                    .where(GpuType.memory_gb == int(pool.group(1)))
                    .order_by(GpuType.id)
                )
            )
            if pool
            else []
        )
        if not ids:
            known = sorted(session.scalars(select(GpuType.id)))
            raise ValidationFailed(
                "gpu_type_ids", f"unknown GPU type {name!r}", {"gpu_types": known}
            )
        out.extend(ids)
    return list(dict.fromkeys(out))


def _check_workers(ctx: Context, workers_min: int, workers_max: int) -> None:
    cap = ctx.settings.serverless_max_workers
    if workers_max > cap:
        raise ValidationFailed("workers_max", f"at most {cap} workers an endpoint")
    if workers_max < workers_min:
        raise ValidationFailed("workers_max", "must be at least workers_min")


def _check_gpus(gpu_count: int, gpu_types: list[str]) -> None:
    if gpu_count > 0 and not gpu_types:
        raise ValidationFailed("gpu_type_ids", "name at least one GPU type (or gpu_count 0)")


def _locations(session: Session, locations: list[str]) -> list[str]:
    for location in locations:
        check_location(session, location, "locations")
    return locations


def _volume_id(session: Session, principal: Principal, volume_id: str | None) -> str | None:
    """``volume_id`` when it is the caller's live network volume; NetworkVolumeNotFound
    (404) otherwise."""
    if volume_id is None:
        return None
    return load_network_volume(session, principal, volume_id).id


def _audit(
    session: Session, principal: Principal, row: ServerlessEndpoint, action: str, now: Any
) -> None:
    record_audit(
        session,
        principal,
        account_id=row.account_id,
        action=f"endpoint.{action}",
        target_type="endpoint",
        target_id=row.id,
        detail={"name": row.name, "version": row.version},
        now=now,
    )


def _read(session: Session, row: ServerlessEndpoint) -> EndpointRead:
    return EndpointRead(row, endpoint_counts(session, [row.id])[row.id])


# ---------------------------------------------------------------- use cases


def create_endpoint(
    ctx: Context, principal: Principal, ref: ProjectRef, body: CreateEndpoint
) -> EndpointRead:
    """A new endpoint of ``ref``'s project (default: the default project), with no
    worker yet (the reconciler starts ``workers_min``). Needs the write permission.
    Raises ValidationFailed, TemplateNotFound / NetworkVolumeNotFound (404),
    ProjectNotFound / Forbidden, EndpointExists (409)."""
    principal.require_write()
    if body.image is None and body.template_id is None:
        raise ValidationFailed("image", "give image or template_id")
    if body.image is not None:
        check_image(body.image, ctx.settings.registry_policy, "image")
    _check_workers(ctx, body.workers_min, body.workers_max)
    box = secret_box(ctx.settings)
    now = ctx.clock.now()
    with ctx.transaction() as session:
        project = project_of_ref(session, principal, ref)
        template: ClusterTemplate | None = None
        if body.template_id is not None:
            template = _template(session, principal, project.account_id, body.template_id)
        gpus = gpu_type_ids(session, body.gpu_type_ids)
        _check_gpus(body.gpu_count, gpus)
        _refuse_taken(session, project.account_id, body.name, None)
        env = tpl.merged_env(template, seal_env(box, body.env, body.secret_env))
        row = ServerlessEndpoint(
            id=new_endpoint_id(),
            account_id=project.account_id,
            project_id=project.id,
            name=body.name,
            template_id=template.id if template is not None else None,
            image=body.image or (template.image if template is not None else ""),
            env=env,
            gpu_type_ids=gpus,
            gpu_count=body.gpu_count,
            cpu_cores=body.cpu_cores,
            memory_gb=body.memory_gb,
            container_disk_gb=_given(
                body.container_disk_gb, template, "container_disk_gb", DEFAULT_CONTAINER_DISK_GB
            ),
            volume_gb=_given(body.volume_gb, template, "volume_gb", DEFAULT_VOLUME_GB),
            volume_mount_path=_given(
                body.volume_mount_path, template, "volume_mount_path", DEFAULT_MOUNT_PATH
            ),
            network_volume_id=_volume_id(session, principal, body.network_volume_id),
            locations=_locations(session, body.locations),
            workers_min=body.workers_min,
            workers_max=body.workers_max,
            idle_timeout_s=body.idle_timeout_s,
            scaler_type=body.scaler_type.value,
            scaler_value=body.scaler_value,
            execution_timeout_ms=body.execution_timeout_ms,
            flashboot=body.flashboot,
            status="active",
            created_at=now,
            updated_at=now,
            version=1,
        )
        _flush(session, row, new=True)
        _audit(session, principal, row, "create", now)
        read = EndpointRead(row, EndpointCounts())
    ctx.wake()
    return read


def _given(value: Any, template: ClusterTemplate | None, field: str, default: Any) -> Any:
    """What the body gave, else the template's ``field``, else ``default``."""
    if value is not None:
        return value
    return getattr(template, field) if template is not None else default


def _scoped(session: Session, scope: ResourceScope) -> Any:
    q = select(ServerlessEndpoint).where(
        ServerlessEndpoint.account_id == scope.account_id,
        ServerlessEndpoint.status.not_in(GONE),
    )
    if scope.project_id is not None:
        q = q.where(ServerlessEndpoint.project_id == scope.project_id)
    if scope.allowed is not None:
        q = q.where(ServerlessEndpoint.project_id.in_(sorted(scope.allowed)))
    return q


def endpoint_page(
    ctx: Context,
    principal: Principal,
    ref: ProjectRef,
    *,
    per_page: int = DEFAULT_PER_PAGE,
    cursor: str | None = None,
) -> EndpointPage:
    """The acting account's live endpoints the caller may use (only
    ``ref.project_id``'s when it names one), oldest first, with their counts (one
    statement for the page). With ``cursor`` (an earlier page's ``next_cursor`` with
    the same filters) the rows after it. Raises ValidationFailed naming ``cursor`` for
    a bad one, ProjectNotFound / Forbidden."""
    cursor = cursor or None
    with ctx.read() as session:
        scope = resource_scope(session, principal, ref)
        bound: dict[str, cursors.FilterValue] = {
            "account": scope.account_id,
            "project_id": scope.project_id,
        }
        after = cursors.decode(cursor, ENDPOINTS_LIST, bound, ENDPOINT_KEY) if cursor else None
        q = _scoped(session, scope)
        total = session.scalar(select(func.count()).select_from(q.subquery())) or 0
        if after is not None:
            q = q.where(
                tuple_(ServerlessEndpoint.created_at, ServerlessEndpoint.id) > tuple_(*after)
            )
        q = q.order_by(ServerlessEndpoint.created_at, ServerlessEndpoint.id).limit(per_page + 1)
        rows: list[ServerlessEndpoint] = list(session.scalars(q))
        page = rows[:per_page]
        counts = endpoint_counts(session, [r.id for r in page])
    next_cursor = None
    if len(rows) > per_page:
        last = page[-1]
        next_cursor = cursors.encode(ENDPOINTS_LIST, bound, (last.created_at, last.id))
    return EndpointPage([EndpointRead(r, counts[r.id]) for r in page], int(total), next_cursor)


def all_endpoints(ctx: Context, principal: Principal) -> list[EndpointRead]:
    """Every live endpoint of the caller's account it may use, oldest first (GraphQL
    ``myself.endpoints``)."""
    with ctx.read() as session:
        scope = resource_scope(session, principal, ProjectRef())
        q = _scoped(session, scope).order_by(ServerlessEndpoint.created_at, ServerlessEndpoint.id)
        rows: list[ServerlessEndpoint] = list(session.scalars(q))
        counts = endpoint_counts(session, [r.id for r in rows])
    return [EndpointRead(r, counts[r.id]) for r in rows]


def show_endpoint(
    ctx: Context, principal: Principal, ref: ProjectRef, endpoint_id: str
) -> EndpointRead:
    """One live endpoint of the acting account (of ``ref.project_id`` when given).
    Raises EndpointNotFound, ProjectNotFound / Forbidden."""
    with ctx.read() as session:
        return _read(session, _find(session, resource_scope(session, principal, ref), endpoint_id))


def update_endpoint(
    ctx: Context,
    principal: Principal,
    ref: ProjectRef,
    endpoint_id: str,
    body: UpdateEndpoint,
) -> EndpointRead:
    """Apply ``body``'s fields (see UpdateEndpoint) and bump the version; new workers
    get the change. Needs the write permission. Raises as show_endpoint and
    create_endpoint."""
    principal.require_write()
    if body.image is not None:
        check_image(body.image, ctx.settings.registry_policy, "image")
    box = secret_box(ctx.settings)
    now = ctx.clock.now()
    with ctx.transaction() as session:
        row = _find(session, resource_scope(session, principal, ref), endpoint_id, lock=True)
        _apply(session, principal, box, row, body)
        _check_workers(ctx, row.workers_min, row.workers_max)
        _check_gpus(row.gpu_count, list(row.gpu_type_ids))
        row.version += 1
        row.updated_at = now
        _flush(session, row, new=False)
        _audit(session, principal, row, "update", now)
        read = _read(session, row)
    ctx.wake()
    return read


def _apply(
    session: Session,
    principal: Principal,
    box: SecretBox,
    row: ServerlessEndpoint,
    body: UpdateEndpoint,
) -> None:
    """``body``'s changes on ``row`` (checked), inside the update's transaction."""
    sent = body.model_fields_set
    if body.name is not None and body.name != row.name:
        _refuse_taken(session, row.account_id, body.name, row.id)
        row.name = body.name
    env_base = dict(row.env)
    if body.template_id is not None:
        template = _template(session, principal, row.account_id, body.template_id)
        row.template_id = template.id
        row.image = template.image
        row.container_disk_gb = template.container_disk_gb
        row.volume_gb = template.volume_gb
        row.volume_mount_path = template.volume_mount_path
        env_base = {**template.env, **env_base}
    if body.env is not None:
        kept = {k: v for k, v in env_base.items() if k in body.env}
        row.env = update_env(box, kept, dict(body.env), body.secret_env)
    elif body.template_id is not None:
        row.env = env_base
    if body.gpu_type_ids is not None:
        row.gpu_type_ids = gpu_type_ids(session, body.gpu_type_ids)
    if body.scaler_type is not None:
        row.scaler_type = body.scaler_type.value
    if body.locations is not None:
        row.locations = _locations(session, body.locations)
    if "network_volume_id" in sent:
        row.network_volume_id = _volume_id(session, principal, body.network_volume_id)
    for field in (
        "image",
        "gpu_count",
        "cpu_cores",
        "memory_gb",
        "container_disk_gb",
        "volume_gb",
        "volume_mount_path",
        "workers_min",
        "workers_max",
        "idle_timeout_s",
        "scaler_value",
        "execution_timeout_ms",
        "flashboot",
    ):
        value = getattr(body, field)
        if value is not None:
            setattr(row, field, value)


def delete_endpoint(ctx: Context, principal: Principal, ref: ProjectRef, endpoint_id: str) -> str:
    """Mark an endpoint ``deleting`` (the reconciler drains and stops its workers) and
    free its name; answers its id. Needs the write permission. Raises as
    show_endpoint, Forbidden."""
    principal.require_write()
    now = ctx.clock.now()
    with ctx.transaction() as session:
        row = _find(session, resource_scope(session, principal, ref), endpoint_id, lock=True)
        _audit(session, principal, row, "delete", now)
        row.status = "deleting"
        row.name = f"{row.name}{DELETED_MARK}{row.id}"
        row.version += 1
        row.updated_at = now
    ctx.wake()
    return endpoint_id
