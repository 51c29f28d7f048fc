"""RunPod v2's pods: ``/runpod/v2/pods`` over gpuyard's cluster use cases.

A pod is a gpuyard cluster (services/clusters/): create, list, read, change, act on
and delete it, and stream its logs; the answers are RunPod's ``Pod``
(api/runpod_v2/pod_views.py), the errors RFC 9457 problem details. Another account's
pod reads as one that does not exist (404 ``CLUSTER_NOT_FOUND``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from fastapi import Depends, Header, Query, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from gpuyard.api.fast import fastpath
from gpuyard.api.fast.view_cache import Rendered
from gpuyard.api.rest import log_follow
from gpuyard.api.runpod_v2 import pod_updates
from gpuyard.api.runpod_v2.common import answer_docs, v2_router
from gpuyard.api.runpod_v2.fast_reads import POD_READS
from gpuyard.api.runpod_v2.pod_requests import create_cluster_input, create_inputs, renamed
from gpuyard.api.runpod_v2.pod_schemas import (
    CreatePodRequest,
    ListPodsResponse,
    Pod,
    PodActionRequest,
    UpdatePodRequest,
)
from gpuyard.api.runpod_v2.pod_views import POD_STATUSES, cluster_statuses, pod_json
from gpuyard.api.state import AppState, app_state, current_principal
from gpuyard.core.errors import (
    GpuyardError,
    InsufficientCapacity,
    InvalidState,
    ValidationFailed,
)
from gpuyard.core.log_lines import MAX_TAIL, Cursor, datetime_ns, parse_since
from gpuyard.core.states import ClusterStatus
from gpuyard.services.clusters import logs as log_reads
from gpuyard.services.clusters import use_cases as uc
from gpuyard.services.clusters import views as cluster_views
from gpuyard.services.clusters.lists import ClusterFilters
from gpuyard.services.clusters.requests import CreateCluster, StartCluster
from gpuyard.services.tenancy.auth import Principal
from gpuyard.store.schema import Cluster

router = v2_router()

POD_PATH = "/pods/{pod_id}"
# Rows per read when the whole list is asked for (no ``limit``).
WHOLE_LIST_PAGE = 500


class NoCapacity(GpuyardError):
    """RunPod answers "this GPU and data center could not be placed" with a 400 (its
    document: try the next candidate); gpuyard's own surfaces say 409."""

    code = "INSUFFICIENT_CAPACITY"
    http_status = 400


def _view(state: AppState, principal: Principal, pod_id: str) -> cluster_views.ClusterDetails:
    return cluster_views.load_visible(
        state.ctx, principal.account_id, pod_id, principal.project_ids
    )


def _pod(state: AppState, principal: Principal, pod_id: str) -> dict[str, Any]:
    return pod_json(_view(state, principal, pod_id), state.ctx.clock.now())


def _place(
    state: AppState, principal: Principal, body: CreateCluster, where: tuple[str, ...]
) -> Cluster:
    """Create the cluster at the first of ``where`` that has room (anywhere when
    empty). An unknown location, or none with room, is a 400 naming dataCenterIds."""
    last: InsufficientCapacity | None = None
    for location in where or (None,):
        try:
            return uc.create_cluster(state.ctx, principal, body, location=location)
        except InsufficientCapacity as exc:
            last = exc
        except ValidationFailed as exc:
            raise renamed(exc) from None
    assert last is not None
    # Named as a field: RunPod's clients read a 400 as "try the next candidate".
    field = "dataCenterIds" if where else "gpu"
    raise NoCapacity(last.message, {**last.details, "field": field}) from None


@router.post("/pods", status_code=201, responses=answer_docs(Pod, 201, "The created pod"))
def create_pod(
    body: CreatePodRequest, request: Request, principal: Principal = Depends(current_principal)
) -> JSONResponse:
    """Create a pod: a gpuyard cluster, placed now and started by the reconciler
    (``PROVISIONING``/``STARTING`` until ``RUNNING``; poll ``GET /pods/{id}``).

    Exactly one of ``gpu`` (a GPU type of the catalog) or ``cpu`` (a CPU pod: no GPU,
    ``vcpuCount`` vCPUs, memory by flavor); ``image`` unless ``templateId`` names a
    template. ``dataCenterIds`` are gpuyard locations, tried in order until one has
    room; none that has is ``400 INSUFFICIENT_CAPACITY`` (RunPod's "try the next
    candidate"). ``mounts``: one volume, ``persistent`` (the pod's own) or ``network``.
    ``cmd`` (or ``args``) is the container's command, ``entrypoint`` its entrypoint;
    ``interruptible`` with ``bidPerGpu`` (or ``bid``) makes a spot pod. ``startSsh`` is
    always so: the account's SSH keys reach every pod as ``PUBLIC_KEY``."""
    state = app_state(request)
    inputs = create_inputs(body)
    cluster = _place(state, principal, create_cluster_input(inputs), inputs.locations)
    return JSONResponse(_pod(state, principal, cluster.id), status_code=201)


def _statuses(status: str | None) -> tuple[ClusterStatus, ...] | None:
    return cluster_statuses(status) if status is not None else None


@router.get("/pods", responses=answer_docs(ListPodsResponse, 200, "The account's pods"))
async def list_pods(
    request: Request,
    principal: Principal = Depends(current_principal),
    name: str | None = Query(default=None, max_length=200, description="Exactly this name"),
    status: str | None = Query(
        default=None, json_schema_extra={"enum": list(POD_STATUSES)}, description="A PodStatus"
    ),
    gpuTypeId: str | None = Query(default=None, max_length=100),
    dataCenterId: str | None = Query(default=None, max_length=100),
    templateId: str | None = Query(default=None, max_length=20),
    networkVolumeId: str | None = Query(default=None, max_length=100),
    imageName: str | None = Query(default=None, max_length=512),
    includeClusterPods: bool = Query(default=False),
    limit: int | None = Query(default=None, ge=1, le=500),
    cursor: str | None = Query(default=None, max_length=512),
) -> Response:
    """The account's pods, newest first: like RunPod, every pod (all of them at once)
    but terminated ones, unless ``status=TERMINATED``.

    gpuyard's extensions: filters that must all hold, ``name`` (exact), ``status``
    (a PodStatus), ``gpuTypeId``, ``dataCenterId`` (a location), ``templateId``,
    ``networkVolumeId``, ``imageName`` (exact); and keyset pages: with ``limit``
    (1-500) the answer holds at most that many and ``nextCursor``, which ``cursor``
    takes (with the same filters) for the next page; null on the last page.
    ``includeClusterPods`` (RunPod's own) changes nothing: gpuyard's training clusters
    are not pods, and their nodes never appear here."""
    if status is not None and status not in POD_STATUSES:
        raise ValidationFailed("status", f"must be one of {', '.join(POD_STATUSES)}")
    if cursor is not None and limit is None:
        raise ValidationFailed("cursor", "pages need a limit (the one the cursor came with)")
    del includeClusterPods
    state = app_state(request)
    filters = ClusterFilters(
        name=name,
        statuses=_statuses(status),
        gpu_type=gpuTypeId,
        location=dataCenterId,
        template_id=templateId,
        network_volume_id=networkVolumeId,
        image=imageName,
    )
    subject = fastpath.list_subject(principal, request.query_params.multi_items(), POD_READS.prefix)
    marks = fastpath.list_marks(state.ctx)
    rendered = state.views.get(subject, principal.account_id, marks)
    if rendered is None:
        # Polls that miss at once share one read; the page is kept for the next ones,
        # which api/fast/fastpath.py answers without routing.
        rendered = await fastpath.shared(
            (subject, principal.account_id),
            lambda: run_in_threadpool(
                _render_list, state, principal, filters, limit, cursor, subject, marks
            ),
        )
    return Response(rendered.data, media_type="application/json")


def _render_list(
    state: AppState,
    principal: Principal,
    filters: ClusterFilters,
    limit: int | None,
    cursor: str | None,
    subject: str,
    marks: tuple[object, ...],
) -> Rendered:
    """Read and render the pods a list asks for (a worker thread), kept in the view
    cache under ``subject``."""
    ctx, cache = state.ctx, state.views
    stamp, now = cache.stamp(), ctx.clock.now()
    size = limit or WHOLE_LIST_PAGE
    pods: list[dict[str, Any]] = []
    while True:
        page = uc.list_clusters(ctx, principal, per_page=size, cursor=cursor, filters=filters)
        pods += [pod_json(d, now) for d in cluster_views.details(ctx, page.clusters)]
        cursor = page.next_cursor
        if limit is not None or cursor is None:
            break
    answer: dict[str, Any] = {"pods": pods}
    if limit is not None:
        answer["nextCursor"] = cursor
    rendered = Rendered(0, fastpath.dumps(answer))
    cache.put(subject, principal.account_id, marks, rendered, stamp)
    return rendered


@router.get(POD_PATH, responses=answer_docs(Pod, 200, "The pod"))
def get_pod(
    pod_id: str, request: Request, principal: Principal = Depends(current_principal)
) -> JSONResponse:
    """One pod (a terminated one shows ``TERMINATED`` while gpuyard keeps it)."""
    return JSONResponse(_pod(app_state(request), principal, pod_id))


@router.patch(POD_PATH, responses=answer_docs(Pod, 200, "The pod after the change"))
def update_pod(
    pod_id: str,
    body: UpdatePodRequest,
    request: Request,
    principal: Principal = Depends(current_principal),
) -> JSONResponse:
    """Change a pod; only the fields sent change. ``name`` changes at once, in any
    status. ``image``, ``env`` (the whole map: variables left out are removed; a
    secret's mask keeps it), ``ports`` (added ones; gpuyard cannot remove a port) and
    ``mounts.persistent.size`` (grow only) are container settings: as RunPod resets a
    pod for them, gpuyard restarts it with them (a running pod is stopped and started
    again, a stopped one is started; a starting one answers 409). ``args``, ``disk``,
    ``registry``, the mount paths and a network volume cannot change after the
    create (409 unless the value is the current one); ``locked`` and
    ``globalNetworking`` can only be false and ``templateId`` is a create's."""
    state = app_state(request)
    pod_updates.apply(state.ctx, principal, pod_id, body)
    return JSONResponse(_pod(state, principal, pod_id))


@router.delete(POD_PATH, status_code=204, responses={204: {"description": "Terminated"}})
def delete_pod(
    pod_id: str, request: Request, principal: Principal = Depends(current_principal)
) -> Response:
    """Terminate the pod: its container and its own volume go (a network volume is
    only detached). Deleting a pod already terminated answers 204 again."""
    state = app_state(request)
    try:
        uc.terminate_cluster(state.ctx, principal, pod_id)
    except InvalidState:
        status = uc.get_cluster(state.ctx, principal, pod_id).status
        if status not in (ClusterStatus.TERMINATING, ClusterStatus.TERMINATED):
            raise
    return Response(status_code=204)


@router.post(
    POD_PATH + "/action",
    responses={
        **answer_docs(Pod, 200, "start, stop, restart: the pod after it"),
        204: {"description": "terminate: the pod is terminated"},
    },
)
def pod_action(
    pod_id: str,
    body: PodActionRequest,
    request: Request,
    principal: Principal = Depends(current_principal),
) -> Response:
    """``start`` (a stopped or failed pod), ``stop`` (a running or starting one: its
    volume kept, compute released), ``restart`` (a running one's container, in place)
    or ``terminate`` (204, as ``DELETE``). The pod's ``actions`` say which are valid
    now; another is ``409 INVALID_STATE``."""
    state = app_state(request)
    ctx = state.ctx
    if body.action == "start":
        uc.start_cluster(ctx, principal, pod_id, StartCluster())
    elif body.action == "stop":
        uc.stop_cluster(ctx, principal, pod_id)
    elif body.action == "restart":
        uc.restart_cluster(ctx, principal, pod_id)
    else:
        uc.terminate_cluster(ctx, principal, pod_id)
        return Response(status_code=204)
    return JSONResponse(_pod(state, principal, pod_id))


_LOG_EVENTS: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "Server-Sent Events: each `data:` is `{source, line, ts}`, each `id:` "
        "the entry's cursor (send it back as `Last-Event-ID`); `event: end` when the pod "
        "is terminated",
        "content": {"text/event-stream": {"schema": {"type": "string"}}},
    },
    204: {"description": "A resume on a terminated pod: nothing more will come"},
}


def _resume(value: str | None, since: str | None, now_ns: int) -> tuple[Cursor | None, int]:
    """Where the stream starts: after a ``Last-Event-ID`` (gpuyard's cursor, or a
    timestamp as RunPod's ids are), else from ``since``; ``(None, 0)``: the tail."""
    if value is not None:
        try:
            return Cursor.parse(value), 0
        except ValueError:
            try:
                return None, parse_since(value, now_ns)
            except ValueError:
                raise ValidationFailed(
                    "Last-Event-ID", "must be an event id of this stream or a time"
                ) from None
    if since is not None:
        try:
            return None, parse_since(since, now_ns)
        except ValueError as exc:
            raise ValidationFailed("since", str(exc)) from None
    return None, 0


@router.get(POD_PATH + "/logs", responses=_LOG_EVENTS)
async def pod_logs(
    pod_id: str,
    request: Request,
    source: str | None = Query(
        default=None,
        json_schema_extra={"enum": ["container", "system"]},
        description="container (its output) or system (gpuyard's events); both when left out",
    ),
    tail: int = Query(default=100, ge=0, le=MAX_TAIL, description="Entries to start with"),
    since: str | None = Query(
        default=None, max_length=64, description="From then on (RFC 3339); tail ignored"
    ),
    follow: bool = Query(
        default=True, description="gpuyard's: false ends the stream after what is there now"
    ),
    last_event_id: str | None = Header(default=None, alias="Last-Event-ID", max_length=64),
    principal: Principal = Depends(current_principal),
) -> Response:
    """The pod's logs as Server-Sent Events: the last ``tail`` entries (or those after
    ``since`` / ``Last-Event-ID``), then what follows as it is written."""
    if source is not None and source not in ("container", "system"):
        raise ValidationFailed("source", "must be container or system")
    state = app_state(request)
    ctx, runtime_of = state.ctx, state.runtime_of
    resume, since_ns = _resume(last_event_id, since, datetime_ns(ctx.clock.now()))
    kind: log_reads.Source | None = None
    if source == "container":
        kind = "container"
    elif source == "system":
        kind = "system"
    if resume is not None:
        page = await run_in_threadpool(
            log_reads.read_after, ctx, principal, runtime_of, pod_id, resume, limit=MAX_TAIL
        )
        if page.status == ClusterStatus.TERMINATED.value and not page.entries:
            return Response(status_code=204)
    else:
        count = MAX_TAIL if since_ns else tail
        # With a source, the tail counts that source's entries: read all, keep its last.
        read = MAX_TAIL if kind is not None else count
        page = await run_in_threadpool(
            log_reads.read_tail, ctx, principal, runtime_of, pod_id, tail=read, since_ns=since_ns
        )
        if kind is not None:
            kept = [e for e in page.entries if e.source == kind]
            page = replace(page, entries=kept[-count:] if count else [])
    return log_follow.respond(state, principal, pod_id, page, source=kind, follow=follow)
