"""Seed 002: ``/distributed_jobs_v2/cluster/`` — training clusters and their actions.

This surface has its own envelope, ``{code, data, errors, message}`` with the HTTP
status equal to ``code``, for answers and errors alike (including a bad key or a body
that is not JSON), so every failure is rendered here rather than by the v1 handlers.

The reads (the list, one cluster, its events) answer a ``200`` with an ``ETag``, the
digest of the body, and ``304`` with no body to an ``If-None-Match`` naming it
(api/http/conditional.py ``revalidated``); errors are never 304.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from gpuyard.api.http.conditional import revalidated
from gpuyard.api.http.idempotency import IdempotencyKeyHeader
from gpuyard.api.http.json_body import loads
from gpuyard.api.http.pagination import legacy_page_size, pagination
from gpuyard.api.rest.schemas import cluster_json as views
from gpuyard.api.state import AppState, app_state, current_principal
from gpuyard.api.training.openapi import ACTION_BODY, CREATE_BODY, operation
from gpuyard.core.cursors import MAX_CURSOR_CHARS
from gpuyard.core.errors import GpuyardError, PayloadTooLarge, ValidationFailed
from gpuyard.core.input_rules import parse_id
from gpuyard.core.text import nul_path
from gpuyard.services import idempotency as idem
from gpuyard.services.access.reserved_ips import reserved_ip_view
from gpuyard.services.tenancy.auth import Principal
from gpuyard.services.training import use_cases as training
from gpuyard.services.training.inputs import parse_action_request, parse_cluster_spec
from gpuyard.services.training.reads import PartitionProbe, show_cluster, show_clusters
from gpuyard.store.outage import is_database_unavailable

log = logging.getLogger(__name__)

BASE = "/distributed_jobs_v2/cluster"
# The list's paging bounds, as on every other list (api/training/openapi.py says them).
MAX_PER_PAGE = 500
MAX_PAGE = 1_000_000
# Declared here so FastAPI does not document its own 422 shape; each route's
# openapi_extra (api/training/openapi.py) gives the real one.
router = APIRouter(
    tags=["training clusters (seed 002)"],
    responses={422: {"description": "IDEMPOTENCY_KEY_REUSED"}},
)


def envelope(code: int, data: Any, message: str, errors: Any = None) -> JSONResponse:
    return JSONResponse(
        {"code": code, "data": data, "errors": errors or {}, "message": message},
        status_code=code,
    )


def error_envelope(exc: GpuyardError) -> JSONResponse:
    errors: dict[str, Any] = {"code": exc.code, "details": exc.details}
    if isinstance(exc, ValidationFailed):
        errors["field"] = exc.field
    return envelope(exc.http_status, {}, exc.message, errors)


def _query_id(request: Request, name: str, *, required: bool) -> int | None:
    return parse_id(name, request.query_params.get(name), required=required)


def _scope(request: Request) -> training.Scope:
    """``project_id``, ``location`` and ``active_iam`` as api/training/openapi.py
    declares them. Raises ValidationFailed naming the parameter."""
    project_id = _query_id(request, "project_id", required=True)
    location = request.query_params.get("location")
    if not location:
        raise ValidationFailed("location", "is required (GET /v1/locations lists them)")
    active_iam = _query_id(request, "active_iam", required=False)
    assert project_id is not None
    return training.Scope(project_id=project_id, location=location, active_iam=active_iam)


def _cluster_id(request: Request) -> int:
    """The path's ``Cluster_Id``: plain ASCII digits, 1..MAX_ID (as OpenAPI says)."""
    number = parse_id("Cluster_Id", request.path_params["Cluster_Id"], required=True)
    assert number is not None
    return number


# Far above any real body (a lifecycle script is at most 64 KiB): parsing stays cheap.
MAX_BODY_BYTES = 256 * 1024


def _integral(value: Any) -> Any:
    """``274.0`` as ``274``: JSON has one number type and JSON Schema counts an integral
    number as an integer, so does this surface (its ids and counts are the body's own
    values or items of its own lists; nothing deeper holds a number)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [int(v) if isinstance(v, float) and v.is_integer() else v for v in value]
    return value


async def _body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if len(raw) > MAX_BODY_BYTES:
        raise PayloadTooLarge(f"request body is larger than {MAX_BODY_BYTES} bytes")
    if not raw:
        raise ValidationFailed("body", "a JSON object is required")
    try:
        body = await loads(raw)  # off the event loop when large
        # Lone surrogates ("\ud800") parse but cannot be stored or encoded.
        json.dumps(body, ensure_ascii=False).encode()
    except (ValueError, RecursionError) as exc:  # UnicodeEncodeError is a ValueError
        raise ValidationFailed("body", "request body is not valid JSON text") from exc
    if not isinstance(body, dict):
        raise ValidationFailed("body", "must be a JSON object")
    body = {name: _integral(value) for name, value in body.items()}
    where = nul_path(body)
    if where is not None:
        raise ValidationFailed(where or "body", "must not contain NUL (\\u0000) characters")
    return body


Work = Callable[[AppState, Principal, training.Scope, dict[str, Any]], tuple[int, Any, str]]


async def _handle(request: Request, work: Work, *, with_body: bool = False) -> JSONResponse:
    """Authenticate, parse the scope (and the JSON body when ``with_body``; otherwise
    ``work`` gets ``{}``), run ``work`` in a worker thread and render. A caller without
    a valid key hears 401, and one whose role may not use the route (reads need
    READ_RESOURCES, the rest WRITE_RESOURCES: api/http/permissions.py) 403, before anything
    about its request is judged."""
    try:
        state = app_state(request)
        principal = await current_principal(request)
        scope = _scope(request)
        body = await _body(request) if with_body else {}
        code, data, message = await run_in_threadpool(work, state, principal, scope, body)
        return envelope(code, data, message)
    except GpuyardError as exc:
        if exc.http_status >= 500:
            log.error("%s: %s", exc.code, exc.message)
        return error_envelope(exc)
    except Exception as exc:  # a bug: logged with its trace, answered without one
        if is_database_unavailable(exc):
            raise  # 503 in this envelope, with Retry-After (api/http/database_outage.py)
        log.exception("training API: %s %s failed", request.method, request.url.path)
        return envelope(500, {}, "internal error", {"code": "INTERNAL_ERROR"})


def _partition(state: AppState) -> PartitionProbe | None:
    """Slurm's partition state of a cluster, when an operator runs its nodes."""
    return None if state.training is None else state.training.partition_state


def _view(state: AppState, principal: Principal, scope: training.Scope, cluster_id: int) -> Any:
    return show_cluster(state.ctx, principal, scope, cluster_id, _partition(state))


@router.post(BASE + "/", status_code=201, openapi_extra=operation(with_id=False, body=CREATE_BODY))
@router.post(BASE, include_in_schema=False)
async def create_training_cluster(
    request: Request, idempotency_key: IdempotencyKeyHeader = None
) -> JSONResponse:
    """Create a training cluster: a controller (login) node and ``no_of_nodes`` workers.
    With an ``Idempotency-Key``, a retry with the same body and query answers the same
    cluster."""

    def work(
        state: AppState, p: Principal, scope: training.Scope, body: dict[str, Any]
    ) -> tuple[int, Any, str]:
        spec = parse_cluster_spec(body)
        ctx = state.ctx
        # The query scope is part of the request: a key reused for another project
        # or location is another request.
        payload = {"scope": asdict(scope), "body": body}
        claim = idem.claim_for(ctx, p, idem.ROUTE_TRAINING, idempotency_key, payload)
        created, _ = idem.create_once(
            ctx, claim, lambda c: str(training.create_cluster(ctx, p, scope, spec, idempotency=c))
        )
        cluster_id = int(created)
        return 201, _view(state, p, scope, cluster_id), "Cluster created successfully"

    return await _handle(request, work, with_body=True)


def _query_int(request: Request, name: str, default: int, maximum: int) -> int:
    """A positive integer query parameter, 1..``maximum``; ``default`` when absent."""
    value = request.query_params.get(name)
    if value is None or value == "":
        return default
    if not value.isascii() or not value.isdigit() or len(value) > 20:
        raise ValidationFailed(name, f"{value[:40]!r} is not an integer")
    number = int(value)
    if not 1 <= number <= maximum:
        raise ValidationFailed(name, f"must be between 1 and {maximum}")
    return number


@router.get(BASE + "/", openapi_extra=operation(with_id=False, paged=True))
@router.get(BASE, include_in_schema=False)
async def list_training_clusters(request: Request) -> Response:
    """Training clusters of ``project_id`` at ``location``, oldest first: all of them
    (up to 5,000, as before the list was paged) without paging parameters, else a page
    at a time: ``per_page`` (1..500, 50) and ``cursor`` (the previous answer's
    ``pagination.next_cursor``) or ``page``. ``data`` is the seed's list; the
    envelope's ``pagination`` says where it lies."""

    def fetch(
        state: AppState, p: Principal, scope: training.Scope, paging: Paging
    ) -> tuple[list[Any], int, str | None]:
        result = show_clusters(
            state.ctx,
            p,
            scope,
            _partition(state),
            per_page=paging.per_page,
            page=paging.page,
            cursor=paging.cursor,
        )
        return result.clusters, result.total, result.next_cursor

    return revalidated(request, await _paged(request, fetch))


@dataclass(frozen=True)
class Paging:
    """A paged list's query: ``page`` (offset view), ``per_page``, ``cursor``."""

    page: int
    per_page: int
    cursor: str | None


def _paging(request: Request) -> Paging:
    cursor = request.query_params.get("cursor")
    if cursor is not None and len(cursor) > MAX_CURSOR_CHARS:
        raise ValidationFailed("cursor", f"must be at most {MAX_CURSOR_CHARS} characters")
    per_page = legacy_page_size(
        _query_int(request, "per_page", 0, MAX_PER_PAGE) or None,
        _query_int(request, "page", 0, MAX_PAGE) or None,
        cursor,
    )
    return Paging(_query_int(request, "page", 1, MAX_PAGE), per_page, cursor)


async def _paged(
    request: Request,
    fetch: Callable[
        [AppState, Principal, training.Scope, Paging], tuple[list[Any], int, str | None]
    ],
) -> JSONResponse:
    """A paged list in seed 002's envelope: ``data`` the page's items, ``pagination``
    where it lies (everything up to 5,000 with no paging parameter, as before lists were
    paged). ``fetch`` reads the page: (items, total, next cursor)."""
    # The page as ``work`` made it, for the envelope's ``pagination`` (``_handle``
    # renders failures, and ``data``).
    paged: dict[str, Any] = {}

    def work(
        state: AppState, p: Principal, scope: training.Scope, body: dict[str, Any]
    ) -> tuple[int, Any, str]:
        paging = _paging(request)
        items, total, next_cursor = fetch(state, p, scope, paging)
        paged["data"] = items
        paged["pagination"] = pagination(paging.page, paging.per_page, total, next_cursor)
        return 200, [], "Success"  # the page is rendered once, below, with its pagination

    answer = await _handle(request, work)
    if "pagination" not in paged or answer.status_code != 200:
        return answer
    body = {"code": 200, "data": paged["data"], "errors": {}, "message": "Success"}
    return JSONResponse({**body, "pagination": paged["pagination"]})


@router.get(BASE + "/{Cluster_Id}/", openapi_extra=operation(with_id=True))
@router.get(BASE + "/{Cluster_Id}", include_in_schema=False)
async def get_training_cluster(request: Request) -> Response:
    """One training cluster with its nodes, SSH entry and Slurm partition state."""

    def work(
        state: AppState, p: Principal, scope: training.Scope, body: dict[str, Any]
    ) -> tuple[int, Any, str]:
        return 200, _view(state, p, scope, _cluster_id(request)), "Success"

    return revalidated(request, await _handle(request, work))


@router.put(BASE + "/{Cluster_Id}/", openapi_extra=operation(with_id=True, body=ACTION_BODY))
@router.put(BASE + "/{Cluster_Id}", include_in_schema=False)
async def act_on_training_cluster(request: Request) -> JSONResponse:
    """Seed 002's actions: update_ssh_keys, update_image, restart_workers,
    restart_cluster, scale_cluster, attach_ip, detach_ip, add_security_group,
    remove_security_group; and update_auto_terminate (``auto_terminate``: the policy's
    changes, answered with the cluster)."""

    def work(
        state: AppState, p: Principal, scope: training.Scope, body: dict[str, Any]
    ) -> tuple[int, Any, str]:
        cluster_id = _cluster_id(request)
        action = parse_action_request(body)
        result = training.perform_action(state.ctx, p, scope, cluster_id, action)
        if result.kind == "reserved_ip":
            assert result.reserved_ip is not None
            return 200, reserved_ip_view(result.reserved_ip), "Reserved IP attached successfully"
        if result.kind == "empty":
            return 200, {}, "Reserved IP detached successfully"
        if result.kind == "message":
            return 200, result.message, result.message
        return 200, _view(state, p, scope, cluster_id), "Cluster updated successfully"

    return await _handle(request, work, with_body=True)


@router.get(BASE + "/{Cluster_Id}/events/", openapi_extra=operation(with_id=True, paged=True))
@router.get(BASE + "/{Cluster_Id}/events", include_in_schema=False)
async def training_cluster_events(request: Request) -> Response:
    """The cluster's status changes and why, oldest first (an operation's error too):
    all of them (up to 5,000) without paging parameters, else a page at a time, as the
    list of clusters pages."""

    def fetch(
        state: AppState, p: Principal, scope: training.Scope, paging: Paging
    ) -> tuple[list[Any], int, str | None]:
        result = training.event_page(
            state.ctx,
            p,
            scope,
            _cluster_id(request),
            page=paging.page,
            per_page=paging.per_page,
            cursor=paging.cursor,
        )
        return [views.event(e) for e in result.events], result.total, result.next_cursor

    return revalidated(request, await _paged(request, fetch))


@router.delete(BASE + "/{Cluster_Id}/", openapi_extra=operation(with_id=True))
@router.delete(BASE + "/{Cluster_Id}", include_in_schema=False)
async def delete_training_cluster(request: Request) -> JSONResponse:
    """Delete: the SSH rules on the controller's host, every node container, the
    network, the Slurm state volume; capacity and reserved IPs are released."""

    def work(
        state: AppState, p: Principal, scope: training.Scope, body: dict[str, Any]
    ) -> tuple[int, Any, str]:
        cluster_id = _cluster_id(request)
        # No operator (GPUYARD_TRAINING_ENABLED=false): nothing was ever built, so
        # what the cluster holds is released at once.
        no_operator = state.training is None
        training.delete_cluster(state.ctx, p, scope, cluster_id, finish_now=no_operator)
        if no_operator:
            return 200, {"id": cluster_id, "status": "deleted"}, "Cluster deleted"
        return 200, {"id": cluster_id, "status": "deleting"}, "Cluster deletion started"

    return await _handle(request, work)
