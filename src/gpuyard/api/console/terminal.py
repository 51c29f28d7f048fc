"""``GET /v1/clusters/{id}/terminal``: a shell in a running cluster, over a WebSocket.

The protocol (binary frames = terminal bytes, text frames = JSON control messages) is
edge/terminal_bridge.py's. This module authenticates, finds the cluster and its
engine, starts the shell and records the session on the cluster's event log.

The API key: the ``Authorization`` header or ``?api_key=`` / ``?apikey=`` as on every
route, or, since browsers cannot set headers on a WebSocket, as a subprotocol:
``new WebSocket(url, ["gpuyard.terminal.v1", "gpuyard.key." + KEY])``. The server
answers with ``gpuyard.terminal.v1`` when it was offered and never echoes the key
subprotocol. A write key is required.

Refusals of the caller (no or bad key 401, read-only key 403, a cluster that is not
the caller's 404, bad ``rows``/``cols`` 400, rate limit 429) are HTTP answers before
the upgrade, in the v1 error envelope: no WebSocket is opened for them. A cluster that
is the caller's but cannot take a shell is told after the upgrade, as a close with a
reason a browser can show: 4409 (not running), 1011 (the engine failed). An open
terminal whose key may no longer write to the cluster (revoked, the membership
removed or narrowed) is closed within seconds with 4403 (api/http/access_watch.py).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable

from fastapi import APIRouter, Depends, Request, WebSocket
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.websockets import WebSocketDisconnect, WebSocketState

from gpuyard.api.http.access_watch import access_ended
from gpuyard.api.http.envelope import error_body, error_response
from gpuyard.api.http.rate_limit import RateLimiter, Verdict, key_id, refusal_body, source_of
from gpuyard.api.state import AppState, app_state, current_principal, key_from, selection_from
from gpuyard.core.errors import GpuyardError, RuntimeFailure, Unauthorized, ValidationFailed
from gpuyard.core.states import ClusterStatus
from gpuyard.edge.exec_pty import ContainerNotRunning, ExecError
from gpuyard.edge.terminal_bridge import (
    CLOSE_INTERNAL,
    CLOSE_NOT_RUNNING,
    DEFAULT_COLS,
    DEFAULT_ROWS,
    MAX_COLS,
    MAX_ROWS,
    Resize,
    TerminalProcess,
    clip_reason,
    exec_target,
    open_shell,
    run_bridge,
)
from gpuyard.runtimes.base import Runtime
from gpuyard.services.clusters.terminal_sessions import (
    TerminalTarget,
    record_terminal_event,
    terminal_target,
)
from gpuyard.services.tenancy.auth import Principal
from gpuyard.services.tenancy.cluster_access import Need

log = logging.getLogger(__name__)

router = APIRouter(tags=["clusters"])

PATH = "/v1/clusters/{cluster_id}/terminal"
SUBPROTOCOL = "gpuyard.terminal.v1"
KEY_SUBPROTOCOL = "gpuyard.key."

# Opens the shell of a container on a host's runtime; ``app.state.terminal_opener``
# replaces it (tests: a fake process instead of an engine).
Opener = Callable[[Runtime, str, Resize], Awaitable[TerminalProcess]]


async def open_exec_shell(runtime: Runtime, container: str, size: Resize) -> TerminalProcess:
    """A login shell with a PTY in ``container`` on ``runtime``'s engine."""
    target = await asyncio.to_thread(exec_target, runtime, container)
    return await open_shell(target, size)


def offered_subprotocols(websocket: WebSocket) -> list[str]:
    found: list[str] = []
    for value in websocket.headers.getlist("sec-websocket-protocol"):
        found.extend(p.strip() for p in value.split(",") if p.strip())
    return found


def presented_key(websocket: WebSocket) -> str | None:
    """The header or query key as every route reads it, else a key subprotocol."""
    key = key_from(websocket.headers.get("authorization"), websocket.query_params.get)
    if key:
        return key
    for proto in offered_subprotocols(websocket):
        if proto.startswith(KEY_SUBPROTOCOL) and len(proto) > len(KEY_SUBPROTOCOL):
            return proto[len(KEY_SUBPROTOCOL) :]
    return None


def requested_size(query: Callable[[str], str | None]) -> Resize:
    """``?rows=&cols=`` (the terminal's first size), defaults 24 x 80."""
    values = {"rows": DEFAULT_ROWS, "cols": DEFAULT_COLS}
    for name, most in (("rows", MAX_ROWS), ("cols", MAX_COLS)):
        raw = query(name)
        if raw is None:
            continue
        if not raw.isascii() or not raw.isdigit() or not 1 <= int(raw) <= most:
            raise ValidationFailed(name, f"an integer from 1 to {most}")
        values[name] = int(raw)
    return Resize(values["rows"], values["cols"])


_DENIAL_CLOSE = {400: 4400, 401: 4401, 403: 4403, 404: 4404, 429: 4429}


async def _deny(websocket: WebSocket, response: JSONResponse) -> None:
    """Refuse the upgrade with ``response`` (a plain HTTP answer), or, on a server
    without the denial extension, with a close code 4000 + the status."""
    if "websocket.http.response" in websocket.scope.get("extensions", {}):
        await websocket.send_denial_response(response)
    else:
        await websocket.close(_DENIAL_CLOSE.get(response.status_code, 4400))


class _Client:
    """Starlette's accepted WebSocket as the bridge's ClientSocket."""

    def __init__(self, websocket: WebSocket) -> None:
        self.ws = websocket

    async def receive(self) -> bytes | str | None:
        try:
            message = await self.ws.receive()
        except (WebSocketDisconnect, RuntimeError):
            return None
        if message["type"] == "websocket.disconnect":
            return None
        data: bytes | None = message.get("bytes")
        if data is not None:
            return data
        text: str | None = message.get("text")
        return text if text is not None else b""

    async def send_bytes(self, data: bytes) -> None:
        await self.ws.send_bytes(data)

    async def send_text(self, data: str) -> None:
        await self.ws.send_text(data)

    async def close(self, code: int, reason: str) -> None:
        if self.ws.application_state != WebSocketState.DISCONNECTED:
            await self.ws.close(code, clip_reason(reason))


async def _admit(
    state: AppState, websocket: WebSocket, cluster_id: str
) -> tuple[TerminalTarget, Resize, Principal] | JSONResponse:
    """Who may open the terminal: ``(target, size, caller)``, or the JSONResponse
    refusing."""
    limiter: RateLimiter | None = getattr(websocket.app.state, "rate_limiter", None)
    source = source_of(websocket.client.host) if websocket.client else "local"
    key = presented_key(websocket)
    if limiter is not None:
        verdict = limiter.admit(source, key_id(key))
        if verdict is not None and not verdict.decision.allowed:
            return _refusal(websocket, verdict)
    try:
        size = requested_size(websocket.query_params.get)
        try:
            principal = await state.principal(key, selection_from(websocket))
        except Unauthorized:
            # Only a wrong key meets the failed-key lockout (api/http/rate_limit.py).
            locked = limiter.key_failed(source) if key and limiter is not None else None
            if locked is not None:
                return _refusal(websocket, locked)
            raise
        target = await state.reads.run(terminal_target, state.ctx, principal, cluster_id)
    except GpuyardError as exc:
        return error_response(exc)
    return target, size, principal


def _refusal(websocket: WebSocket, verdict: Verdict) -> JSONResponse:
    """The 429 refusing ``verdict``, in the REST envelope with Retry-After."""
    retry = max(1, math.ceil(verdict.decision.retry_after_s))
    return JSONResponse(
        refusal_body(websocket.url.path, verdict, retry),
        status_code=429,
        headers={"Retry-After": str(retry)},
    )


@router.websocket(PATH)
async def terminal(websocket: WebSocket, cluster_id: str) -> None:
    """A shell in the cluster's container (see the module docstring)."""
    state: AppState = websocket.app.state.gpuyard
    admitted = await _admit(state, websocket, cluster_id)
    if isinstance(admitted, JSONResponse):
        await _deny(websocket, admitted)
        return
    target, size, principal = admitted
    offered = offered_subprotocols(websocket)
    await websocket.accept(subprotocol=SUBPROTOCOL if SUBPROTOCOL in offered else None)
    client = _Client(websocket)
    if target.status != ClusterStatus.RUNNING.value:
        await client.close(
            CLOSE_NOT_RUNNING,
            f"cluster {target.cluster_id} is {target.status}: start it to open a terminal",
        )
        return
    opener: Opener = getattr(websocket.app.state, "terminal_opener", None) or open_exec_shell
    try:
        runtime = await run_in_threadpool(state.runtime_of, target.host_id)
        process = await opener(runtime, target.container, size)
    except ContainerNotRunning:
        await client.close(CLOSE_NOT_RUNNING, "the cluster's container is not running")
        return
    except (ExecError, RuntimeFailure) as exc:
        text = exc.message
        log.warning("terminal for cluster %s could not start: %s", target.cluster_id, text)
        await client.close(CLOSE_INTERNAL, f"cannot open a shell: {text}")
        return
    source = websocket.client.host if websocket.client else "unknown"
    try:
        await run_in_threadpool(
            record_terminal_event,
            state.ctx,
            target.cluster_id,
            f"web terminal opened with API key {target.key_name!r} from {source}",
        )
    except BaseException:
        await process.close()  # the shell must not outlive a session that never began
        raise
    guard = access_ended(state, principal, target.cluster_id, Need.WRITE)
    result = await run_bridge(client, process, guard)
    if result.access_ended:
        how = "the API key may no longer use the cluster"
    elif result.exit_code is None:
        how = "the client left"
    else:
        how = f"the shell exited with code {result.exit_code}"
    await run_in_threadpool(
        record_terminal_event, state.ctx, target.cluster_id, f"web terminal closed: {how}"
    )


@router.get(PATH, include_in_schema=False)
def terminal_over_http(
    cluster_id: str, request: Request, principal: Principal = Depends(current_principal)
) -> JSONResponse:
    """A plain GET: the same checks, then 426 (this endpoint speaks WebSocket only)."""
    requested_size(request.query_params.get)
    terminal_target(app_state(request).ctx, principal, cluster_id)
    return JSONResponse(
        error_body(
            "UPGRADE_REQUIRED",
            "this endpoint is a WebSocket: connect with Upgrade: websocket",
            {"protocol": SUBPROTOCOL},
        ),
        status_code=426,
        headers={"Upgrade": "websocket", "Connection": "Upgrade"},
    )
