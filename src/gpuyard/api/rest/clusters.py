"""REST v1 and v2 cluster endpoints (seed 000)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from gpuyard.api.fast import fastpath
from gpuyard.api.fast.view_cache import Rendered
from gpuyard.api.http.conditional import ok_tagged, tagged
from gpuyard.api.http.envelope import ok
from gpuyard.api.http.idempotency import REPLAYED_HEADER, IdempotencyKeyHeader
from gpuyard.api.http.json_body import OffLoopJsonRoute
from gpuyard.api.http.openapi_responses import ERROR_RESPONSES
from gpuyard.api.http.pagination import CURSOR_QUERY, legacy_page_size, pagination
from gpuyard.api.rest.schemas import cluster_json as views
from gpuyard.api.rest.schemas import responses as schemas
from gpuyard.api.rest.schemas.responses import documented
from gpuyard.api.state import AppState, app_state, current_principal
from gpuyard.core.states import ClusterStatus
from gpuyard.services import idempotency as idem
from gpuyard.services.billing import spot
from gpuyard.services.clusters import use_cases as uc
from gpuyard.services.clusters import views as cluster_views
from gpuyard.services.clusters.requests import (
    MAX_ID,
    AutoTerminateUpdate,
    BidResume,
    CreateCluster,
    StartCluster,
)
from gpuyard.services.tenancy.auth import Principal

# JSON bodies above a few KiB are parsed off the event loop (api/http/json_body.py).
router = APIRouter(tags=["clusters"], responses=ERROR_RESPONSES, route_class=OffLoopJsonRoute)

SETTLED = {
    ClusterStatus.RUNNING,
    ClusterStatus.ERROR,
    ClusterStatus.STOPPED,
    ClusterStatus.TERMINATED,
}


def _detail(state: AppState, principal: Principal, cluster_id: str) -> cluster_views.ClusterDetails:
    return cluster_views.load_visible(
        state.ctx, principal.account_id, cluster_id, principal.project_ids
    )


async def _wait_settled(
    state: AppState, principal: Principal, cluster_id: str, timeout_s: float
) -> tuple[cluster_views.ClusterDetails, bool]:
    """Wait on the recorded status (woken by the reconciler's notifier) until it
    settles or the timeout passes. Returns the details and whether it timed out.

    The caller has just read or written the cluster as its owner. Each wake reads
    only its status (one indexed row); the details, a few milliseconds of reads,
    only once it has settled, in the same worker call: a start wakes the waiter at
    each of its steps, and the reads took CPU from the start itself. The wake comes
    to this event loop itself (a notifier listener), not through a thread of its own
    that would hand it on."""
    deadline = time.monotonic() + timeout_s
    notifier = state.ctx.notifier
    loop = asyncio.get_running_loop()
    changed = asyncio.Event()

    def ring() -> None:
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits
            loop.call_soon_threadsafe(changed.set)

    notifier.listen(ring)
    try:
        while True:
            changed.clear()
            d = await run_in_threadpool(_detail_if_settled, state, principal, cluster_id)
            if d is not None:
                return d, False
            left = deadline - time.monotonic()
            if left <= 0:
                return await run_in_threadpool(_detail, state, principal, cluster_id), True
            # A second's cap: a change whose ring was lost is still seen.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), min(left, 1.0))
    finally:
        notifier.unlisten(ring)


def _detail_if_settled(
    state: AppState, principal: Principal, cluster_id: str
) -> cluster_views.ClusterDetails | None:
    """The details once the recorded status has settled (None: not yet); a row gone
    (purged) has settled, and its details then raise as a read of it does."""
    seen = cluster_views.status_of(state.ctx, cluster_id)
    if seen is not None and not _is_settled(*seen):
        return None
    d = _detail(state, principal, cluster_id)
    return d if _is_settled(d.cluster.status, d.cluster.pending_start is not None) else None


def _is_settled(status: str, start_pending: bool) -> bool:
    # A stopped cluster with a start pending is on its way to running.
    return ClusterStatus(status) in SETTLED and not start_pending


@router.post(
    "/v1/clusters",
    status_code=201,
    responses=documented(schemas.ClusterEnvelope, 201),
)
async def create_cluster(
    body: CreateCluster,
    request: Request,
    idempotency_key: IdempotencyKeyHeader = None,
    principal: Principal = Depends(current_principal),
) -> JSONResponse:
    """Create a cluster: placed at once, then started by the reconciler. With an
    ``Idempotency-Key``, a retry answers the same cluster (see the header). With
    ``wait_for_ready`` (as a start has), the answer comes once the cluster is
    running or has settled otherwise, or after ``timeout_minutes``
    (``meta.wait_timed_out``); the wait is the reconciler's notifier, not a poll."""
    state = app_state(request)
    cluster_id, replayed = await run_in_threadpool(
        _create_once, state, principal, body, idempotency_key
    )
    meta: dict[str, Any] = {}
    if body.wait_for_ready:
        d, timed_out = await _wait_settled(state, principal, cluster_id, body.timeout_minutes * 60)
        meta = {"wait_for_ready": True, "wait_timed_out": timed_out}
    else:
        d = await run_in_threadpool(_detail, state, principal, cluster_id)
    answer = ok(views.cluster_v1(d), status_code=201, **meta)
    if replayed:
        answer.headers[REPLAYED_HEADER] = "true"
    return answer


def _create_once(
    state: AppState, principal: Principal, body: CreateCluster, idempotency_key: str | None
) -> tuple[str, bool]:
    """The create (or, for a retried ``Idempotency-Key``, the cluster it made) and
    whether it was a replay. How long the caller waits is no part of the request a
    key stands for."""
    ctx = state.ctx
    request = body.model_dump(mode="json", exclude={"wait_for_ready", "timeout_minutes"})
    claim = idem.claim_for(ctx, principal, idem.ROUTE_CLUSTERS, idempotency_key, request)
    return idem.create_once(
        ctx, claim, lambda c: uc.create_cluster(ctx, principal, body, idempotency=c).id
    )


def _render_list(
    state: AppState, principal: Principal, subject: str, marks: object, query: dict[str, Any]
) -> Rendered:
    """Read and render one page (a worker thread), kept in the view cache."""
    cache = state.views
    stamp = cache.stamp()
    result = uc.list_clusters(state.ctx, principal, **query)
    items = cluster_views.details(state.ctx, result.clusters)
    data = {
        "clusters": [views.cluster_v1(d) for d in items],
        "pagination": pagination(
            query["page"], query["per_page"], result.total, result.next_cursor
        ),
    }
    rendered = Rendered(0, fastpath.dumps(data))
    cache.put(subject, principal.account_id, marks, rendered, stamp)
    return rendered


@router.get("/v1/clusters", responses=documented(schemas.ClusterListEnvelope))
async def list_clusters(
    request: Request,
    principal: Principal = Depends(current_principal),
    project_id: int | None = Query(default=None, ge=1, le=MAX_ID),
    search: str | None = Query(default=None, max_length=200),
    # Checked by the service (its 400 lists the statuses); OpenAPI says which they are.
    status: str | None = Query(
        default=None, max_length=20, json_schema_extra={"enum": [s.value for s in ClusterStatus]}
    ),
    page: int = Query(default=1, ge=1, le=1_000_000),
    per_page: int = Query(default=50, ge=1, le=500),
    cursor: str | None = CURSOR_QUERY,
) -> Response:
    """The account's clusters, newest first (terminated ones with
    ``status=terminated``). Page with ``cursor`` (the previous answer's
    ``pagination.next_cursor``, with the same filters): stable while clusters are
    created. ``page`` (offset) still works, but not together with a cursor.

    A page polled by many clients is read once: its rendered answer is kept for a
    moment and forgotten at any write (api/fast/view_cache.py). The answer's ``ETag`` is
    its data's digest: ``If-None-Match`` with it answers 304 while the page is the
    same."""
    state = app_state(request)
    query: dict[str, Any] = {
        "project_id": project_id,
        "search": search,
        "status": status,
        "page": page,
        "per_page": per_page,
        "cursor": cursor,
    }
    subject = fastpath.list_subject(principal, request.query_params.multi_items())
    marks = fastpath.list_marks(state.ctx)
    rendered = state.views.get(subject, principal.account_id, marks)
    if rendered is None:
        # Polls that miss at once (a write forgot the page) share one read.
        rendered = await fastpath.shared(
            (subject, principal.account_id),
            lambda: run_in_threadpool(_render_list, state, principal, subject, marks, query),
        )
    data = rendered.data
    return tagged(request, fastpath.etag_of(data), lambda: fastpath.ok_bytes(data))


@router.get("/v1/clusters/{cluster_id}", responses=documented(schemas.ClusterEnvelope))
async def get_cluster(cluster_id: str, request: Request) -> Response:
    """One cluster. Served by api/fast/fastpath.py's middleware before routing (this route
    documents it and answers the same way if the middleware is not installed). The
    answer's ``ETag`` is its data's digest: ``If-None-Match`` with it answers 304 while
    the cluster shows the same."""
    status, body, etag = await fastpath.answer(
        app_state(request),
        request.headers.get("authorization"),
        request.query_params.get,
        cluster_id,
        request,
        if_none_match=request.headers.get("if-none-match"),
    )
    headers = {"ETag": etag} if etag is not None else None
    if status == 304:
        return Response(status_code=304, headers=headers)
    return Response(body, status_code=status, media_type="application/json", headers=headers)


@router.get("/v1/clusters/{cluster_id}/events", responses=documented(schemas.EventListEnvelope))
def cluster_events(
    cluster_id: str,
    request: Request,
    principal: Principal = Depends(current_principal),
    page: int | None = Query(default=None, ge=1, le=1_000_000),
    per_page: int | None = Query(default=None, ge=1, le=500),
    cursor: str | None = CURSOR_QUERY,
) -> Response:
    """The cluster's events, oldest first. With ``per_page``, ``page`` or ``cursor``
    a page at a time (50 by default; ``pagination.next_cursor`` pages on); with none of
    them every event, up to 5,000, as before the list was paged. The answer's ``ETag``
    is its data's digest: ``If-None-Match`` with it answers 304 while the page is the
    same (api/http/conditional.py)."""
    size = legacy_page_size(per_page, page, cursor)
    result = uc.event_page(
        app_state(request).ctx, principal, cluster_id, page=page or 1, per_page=size, cursor=cursor
    )
    return ok_tagged(
        request,
        {
            "events": [views.event(e) for e in result.events],
            "pagination": pagination(page or 1, size, result.total, result.next_cursor),
        },
    )


async def _start(
    request: Request, principal: Principal, cluster_id: str, body: StartCluster
) -> tuple[dict[str, Any], dict[str, Any], cluster_views.ClusterDetails]:
    state = app_state(request)
    result = await run_in_threadpool(uc.start_cluster, state.ctx, principal, cluster_id, body)
    wait = body.timeout_minutes * 60 if body.wait_for_ready else None
    return await _started(request, principal, cluster_id, result, wait)


async def _started(
    request: Request,
    principal: Principal,
    cluster_id: str,
    result: uc.StartResult,
    wait: float | None,
) -> tuple[dict[str, Any], dict[str, Any], cluster_views.ClusterDetails]:
    """The start answer: the cluster (after waiting up to ``wait`` seconds for it to
    settle, when given), what changed, and the rates before and after."""
    state = app_state(request)
    meta: dict[str, Any] = {"wait_for_ready": wait is not None}
    if wait is not None:
        d, timed_out = await _wait_settled(state, principal, cluster_id, wait)
        meta["wait_timed_out"] = timed_out
    else:
        d = await run_in_threadpool(_detail, state, principal, cluster_id)
    data = views.cluster_v1(d)
    data["configuration_updates_applied"] = result.configuration_updates_applied
    before = result.snapshot_before_changes
    data["snapshot_before_changes"] = (
        {"id": before.id, "name": before.name, "status": before.status} if before else None
    )
    data["cost"] = {
        **data["cost"],
        "new_hourly_rate": result.new_rate,
        "previous_hourly_rate": result.previous_rate,
        "rate_change_reason": result.rate_change_reason,
    }
    return data, meta, d


@router.post("/v1/clusters/{cluster_id}/start", responses=documented(schemas.StartEnvelope))
async def start_cluster(
    cluster_id: str,
    request: Request,
    body: StartCluster | None = None,
    principal: Principal = Depends(current_principal),
) -> JSONResponse:
    """Start a stopped cluster, optionally changing its configuration first."""
    data, meta, _ = await _start(request, principal, cluster_id, body or StartCluster())
    return ok(data, **meta)


@router.post("/v1/clusters/{cluster_id}/bid-resume", responses=documented(schemas.StartEnvelope))
async def bid_resume_cluster(
    cluster_id: str,
    body: BidResume,
    request: Request,
    principal: Principal = Depends(current_principal),
) -> JSONResponse:
    """Resume a stopped cluster as spot at ``bid_per_gpu``: lower bids on its host may
    be preempted; a bid below the GPU type's spot floor is refused."""
    state = app_state(request)
    result = await run_in_threadpool(
        spot.bid_resume_cluster, state.ctx, principal, cluster_id, body.bid_per_gpu, body.gpu_count
    )
    data, meta, _ = await _started(request, principal, cluster_id, result, wait=None)
    return ok(data, **meta)


@router.put(
    "/v1/clusters/{cluster_id}/auto-terminate", responses=documented(schemas.ClusterEnvelope)
)
def update_auto_terminate(
    cluster_id: str,
    body: AutoTerminateUpdate,
    request: Request,
    principal: Principal = Depends(current_principal),
) -> JSONResponse:
    """Change the auto-termination policy (same fields as ``auto_terminate_updates``);
    on a running cluster it applies to the current run at once."""
    state = app_state(request)
    uc.update_auto_terminate(state.ctx, principal, cluster_id, body)
    return ok(views.cluster_v1(_detail(state, principal, cluster_id)))


@router.post("/v1/clusters/{cluster_id}/stop", responses=documented(schemas.ClusterEnvelope))
def stop_cluster(
    cluster_id: str, request: Request, principal: Principal = Depends(current_principal)
) -> JSONResponse:
    state = app_state(request)
    uc.stop_cluster(state.ctx, principal, cluster_id)
    return ok(views.cluster_v1(_detail(state, principal, cluster_id)))


@router.post("/v1/clusters/{cluster_id}/restart", responses=documented(schemas.ClusterEnvelope))
def restart_cluster(
    cluster_id: str, request: Request, principal: Principal = Depends(current_principal)
) -> JSONResponse:
    state = app_state(request)
    uc.restart_cluster(state.ctx, principal, cluster_id)
    return ok(views.cluster_v1(_detail(state, principal, cluster_id)))


@router.delete("/v1/clusters/{cluster_id}", responses=documented(schemas.ClusterEnvelope))
def terminate_cluster(
    cluster_id: str, request: Request, principal: Principal = Depends(current_principal)
) -> JSONResponse:
    state = app_state(request)
    uc.terminate_cluster(state.ctx, principal, cluster_id)
    return ok(views.cluster_v1(_detail(state, principal, cluster_id)))


@router.post("/v2/clusters/{cluster_id}/start", responses=documented(schemas.ClusterV2))
async def start_cluster_v2(
    cluster_id: str,
    request: Request,
    body: StartCluster | None = None,
    principal: Principal = Depends(current_principal),
) -> JSONResponse:
    """The flat v2 object of seed 000; errors keep the v1 envelope."""
    _, _, d = await _start(request, principal, cluster_id, body or StartCluster())
    return JSONResponse(views.cluster_v2(d))


@router.get("/v2/clusters/{cluster_id}", responses=documented(schemas.ClusterV2))
async def get_cluster_v2(
    cluster_id: str, request: Request, principal: Principal = Depends(current_principal)
) -> JSONResponse:
    """The flat v2 object; the read runs on the read lane, never on the event loop."""
    state = app_state(request)
    d = await state.reads.run(_detail, state, principal, cluster_id)
    return JSONResponse(views.cluster_v2(d))
