"""``/v1/hosts`` (admin): the fleet. Add a host by its engine URL, list and show hosts
with capacity, reachability and what runs on them, cordon and uncordon, delete an
empty one, and the SSH public key hosts must trust. The use cases live in
services/fleet/admin.py and services/fleet/views.py; these routes only adapt HTTP."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response
from starlette.convertors import StringConvertor, register_url_convertor

from gpuyard.api.http.conditional import ok_tagged
from gpuyard.api.http.envelope import ok
from gpuyard.api.http.json_body import OffLoopJsonRoute
from gpuyard.api.http.openapi_responses import ERROR_RESPONSES
from gpuyard.api.http.path_ids import IdPath
from gpuyard.api.rest.schemas.hosts import (
    AddHostIn,
    HostDeletedEnvelope,
    HostDrainEnvelope,
    HostEnvelope,
    HostListEnvelope,
    HostOut,
    HostWorkload,
    SshPublicKeyEnvelope,
    UpdateHostIn,
)
from gpuyard.api.rest.schemas.responses import StrictOut, documented
from gpuyard.api.state import app_state, current_principal
from gpuyard.core.fleet import Reachability
from gpuyard.core.network.engine_address import redacted
from gpuyard.core.network.proxy import ProxyStatus
from gpuyard.core.placement import AllocationRatios, free_resources
from gpuyard.services.clusters.moves import drain_host
from gpuyard.services.fleet import admin as host_admin
from gpuyard.services.fleet.views import HostView, Workload, get_host, list_hosts
from gpuyard.services.tenancy.auth import Principal

router = APIRouter(tags=["hosts"], responses=ERROR_RESPONSES, route_class=OffLoopJsonRoute)


class _HostRef(StringConvertor):
    """A path segment naming a host: anything (IdPath then answers 400 for what is not
    an id) but ``ssh-key``, whose path is its own route's alone, so a 405 there names
    only GET (api/http/method_not_allowed.py)."""

    regex = "(?!ssh-key$)[^/]+"


register_url_convertor("host_ref", _HostRef())
# The paths of one host; OpenAPI shows them as /v1/hosts/{host_id}.
ONE = "/v1/hosts/{host_id:host_ref}"


def _render(request: Request, view: HostView) -> dict[str, Any]:
    state = app_state(request)
    # The server's own engine is asked now (outside any transaction); any other
    # host's engine is as its last heartbeat found it.
    problem = state.runtime.available() if view.is_local else None
    return {
        **host_view(view, problem, state.ctx.settings.allocation_ratios),
        "proxy": proxy_state(state.ctx.proxy),
    }


def proxy_state(status: ProxyStatus) -> dict[str, Any]:
    """Whether clusters' http ports on the host are reachable through the HTTP proxy
    (their ``proxy_url`` is null when not), and why not."""
    problem = status.problem()
    return {"available": problem is None, "reason": problem}


@router.get("/v1/hosts", responses=documented(HostListEnvelope))
def hosts(request: Request, principal: Principal = Depends(current_principal)) -> Response:
    """This installation's id and every host (any status, reachable or not): identity,
    engine, reachability, status, capacity with what is allocated and free, where each
    inventory figure came from, and the clusters on it (admin).

    Polled (the console's hosts page): the answer's ``ETag`` is its data's digest, and
    ``If-None-Match`` with it answers 304 with no body while nothing shown changed
    (api/http/conditional.py)."""
    state = app_state(request)
    overview = list_hosts(state.ctx, principal)
    # The server's own engine is asked now, outside any transaction; others' state is
    # their last heartbeat.
    local_problem = state.runtime.available() if any(h.is_local for h in overview.hosts) else None
    ratios = state.ctx.settings.allocation_ratios
    return ok_tagged(
        request,
        {
            "installation_id": overview.installation_id,
            "hosts": [
                {**host_view(h, local_problem, ratios), "proxy": proxy_state(state.ctx.proxy)}
                for h in overview.hosts
            ],
        },
    )


@router.post("/v1/hosts", status_code=201, responses=documented(HostEnvelope, 201))
def add_host(
    body: AddHostIn, request: Request, principal: Principal = Depends(current_principal)
) -> JSONResponse:
    """Add a host by its engine URL: ``unix:///path.sock``,
    ``ssh://user@host[:port][/socket/path]`` (the installation's key, see
    ``GET /v1/hosts/ssh-key``) or ``tcp://host:port`` (with ``engine_tls_dir`` unless on
    loopback). It takes placements once its first heartbeat answers; what is not
    declared is discovered then. 409 HOST_EXISTS for a name or engine already
    registered (admin)."""
    view = host_admin.add_host(app_state(request).ctx, principal, body.spec())
    return ok(_render(request, view), status_code=201)


@router.get("/v1/hosts/ssh-key", responses=documented(SshPublicKeyEnvelope))
def ssh_key(request: Request, principal: Principal = Depends(current_principal)) -> JSONResponse:
    """The installation's SSH public key: add it to ``~/.ssh/authorized_keys`` of the
    user named in a host's ``ssh://`` engine URL (admin)."""
    return ok({"public_key": host_admin.installation_ssh_key(app_state(request).ctx, principal)})


@router.get(ONE, responses=documented(HostEnvelope))
def get_one(
    host_id: IdPath, request: Request, principal: Principal = Depends(current_principal)
) -> JSONResponse:
    """One host, as in the list (admin). 404 HOST_NOT_FOUND."""
    return ok(_render(request, get_host(app_state(request).ctx, principal, host_id)))


@router.patch(ONE, responses=documented(HostEnvelope))
def update_one(
    host_id: IdPath,
    body: UpdateHostIn,
    request: Request,
    principal: Principal = Depends(current_principal),
) -> JSONResponse:
    """Change a host's settings (admin); fields left out stay as they are:
    ``client_address``, where clients reach its published ports when not at its
    ``address`` (a NAT's outside address, a DNS name; pods' public SSH entries show it),
    null for its own address; ``cuda_version``, its CUDA driver version where NVML
    cannot tell it (declared GPUs), null for what is discovered. 404 HOST_NOT_FOUND."""
    view = host_admin.update_host(app_state(request).ctx, principal, host_id, body.changes())
    return ok(_render(request, view))


@router.post(ONE + "/cordon", responses=documented(HostEnvelope))
def cordon(
    host_id: IdPath, request: Request, principal: Principal = Depends(current_principal)
) -> JSONResponse:
    """Place nothing new on the host; what runs there stays (admin). Idempotent; a
    draining host stays draining."""
    return ok(_render(request, host_admin.cordon(app_state(request).ctx, principal, host_id)))


@router.post(ONE + "/uncordon", responses=documented(HostEnvelope))
def uncordon(
    host_id: IdPath, request: Request, principal: Principal = Depends(current_principal)
) -> JSONResponse:
    """Take placements on the host again; ends a drain too (admin). Idempotent."""
    return ok(_render(request, host_admin.uncordon(app_state(request).ctx, principal, host_id)))


@router.post(ONE + "/drain", responses=documented(HostDrainEnvelope))
def drain(
    host_id: IdPath, request: Request, principal: Principal = Depends(current_principal)
) -> JSONResponse:
    """Cordon the host and send its clusters away (admin): running ones are stopped and
    started again on other hosts with their volume, stopped ones have their volume
    moved. Training workers are recreated on other hosts of their location
    (``drain.training_nodes.moving``); ``drain.cannot_move`` and
    ``drain.training_nodes.cannot_move`` list what has nowhere to go yet and why
    (retried while the host drains). Idempotent."""
    ctx = app_state(request).ctx
    report = drain_host(ctx, principal, host_id)
    return ok(
        {
            "host": _render(request, get_host(ctx, principal, host_id)),
            "drain": {
                "stopping": report.stopping,
                "moving": report.moving,
                "cannot_move": report.cannot_move,
                "training_nodes": {
                    "moving": [asdict(m) for m in report.training.moving],
                    "cannot_move": [asdict(n) for n in report.training.cannot_move],
                },
            },
        }
    )


@router.delete(ONE, responses=documented(HostDeletedEnvelope))
def delete(
    host_id: IdPath, request: Request, principal: Principal = Depends(current_principal)
) -> JSONResponse:
    """Remove a host with nothing left on it (admin). 409 HOST_NOT_EMPTY with
    ``details.left`` (clusters, training clusters and nodes, reservations, GPU and port
    allocations, volume moves, quarantined volumes); 409 LOCAL_HOST for a machine a
    server runs on."""
    return ok(host_admin.delete_host(app_state(request).ctx, principal, host_id))


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


def _resources(gpus: dict[str, int], vcpus: float, memory: float, disk: float) -> dict[str, Any]:
    return {"gpus": gpus, "vcpus": vcpus, "memory_gb": memory, "disk_gb": disk}


def _fields(model: type[StrictOut]) -> tuple[str, ...]:
    return tuple(model.model_fields)


# The answer's shape is its schema's: a host is answered with exactly HostOut's fields,
# in their order, each taken from the same-named field of the service's HostView
# unless it is worked out below (a test holds the two together).
HOST_FIELDS = _fields(HostOut)
WORKLOAD_FIELDS = _fields(HostWorkload)
# Set by the route, not by the view.
_ROUTE_FIELDS = frozenset({"proxy"})


def _workload(w: Workload) -> dict[str, Any]:
    return {name: getattr(w, name) for name in WORKLOAD_FIELDS}


def host_view(h: HostView, local_problem: str | None, ratios: AllocationRatios) -> dict[str, Any]:
    """One host as the API shows it: api/rest/schemas/hosts.py HostOut's fields but ``proxy``
    (the route adds it). ``local_problem``: what the server's own engine answered just
    now (used for the local host only)."""
    cap = h.capacity
    free = free_resources(cap, ratios)
    total_gpus: dict[str, int] = {}
    held_gpus: dict[str, int] = {}
    for g in cap.gpus:
        total_gpus[g.gpu_type] = total_gpus.get(g.gpu_type, 0) + 1
        if g.index in cap.used_gpu_indices:
            held_gpus[g.gpu_type] = held_gpus.get(g.gpu_type, 0) + 1
    if h.is_local:
        engine = {"reachable": local_problem is None, "message": local_problem}
    else:
        engine = {
            "reachable": h.reachability is Reachability.REACHABLE,
            "message": h.heartbeat_error,
        }
    worked_out: dict[str, Any] = {
        "engine_url": redacted(h.engine_url),
        "engine": engine,
        "reachability": h.reachability.value,
        "last_heartbeat_at": _iso(h.last_heartbeat_at),
        "unreachable_since": _iso(h.unreachable_since),
        "declared": list(h.declared),
        "inventory": h.inventory_sources,
        "gpus": [
            {
                "index": g.index,
                "type": g.gpu_type,
                "uuid": g.uuid,
                "allocated": g.index in cap.used_gpu_indices,
            }
            for g in cap.gpus
        ],
        "free": free,
        "capacity": {
            "total": _resources(total_gpus, h.vcpus, h.memory_gb, h.disk_gb),
            "allocated": _resources(
                held_gpus, cap.used_vcpus, cap.used_memory_gb, cap.used_disk_gb
            ),
            "free": _resources(free["gpus"], free["vcpus"], free["memory_gb"], free["disk_gb"]),
        },
        "clusters": [_workload(w) for w in h.workloads],
        "created_at": h.created_at.isoformat(),
    }
    return {
        name: worked_out[name] if name in worked_out else getattr(h, name)
        for name in HOST_FIELDS
        if name not in _ROUTE_FIELDS
    }
