"""``GET /v1/clusters/{id}/logs``: a cluster's container output and gpuyard's own
events for it, as one time-ordered stream of ``{source: container|system, line, ts}``.

Without ``follow`` the answer is a JSON list in the v1 envelope; with ``follow=true``
it is Server-Sent Events (api/rest/log_follow.py). Both give every entry its cursor (``id``;
the SSE event id), which ``after=`` or ``Last-Event-ID`` resume from. Reads only: a
``read`` key is enough. Another account's cluster is ``404 CLUSTER_NOT_FOUND``; a bad
``tail``, ``since`` or cursor is ``400 VALIDATION_ERROR`` naming it.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.responses import Response
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from gpuyard.api.http.envelope import Meta, ok
from gpuyard.api.http.openapi_responses import ERROR_RESPONSES
from gpuyard.api.rest import log_follow
from gpuyard.api.state import app_state, current_principal
from gpuyard.core.errors import ValidationFailed
from gpuyard.core.log_lines import (
    CURSOR_PATTERN,
    MAX_TAIL,
    SINCE_PATTERN,
    Cursor,
    datetime_ns,
    parse_since,
)
from gpuyard.core.states import ClusterStatus
from gpuyard.services.clusters import logs as svc
from gpuyard.services.tenancy.auth import Principal

router = APIRouter(tags=["clusters"], responses=ERROR_RESPONSES)


class LogEntryOut(BaseModel):
    id: str
    source: Literal["container", "system"]
    line: str
    ts: str


class LogMeta(Meta):
    # The cursor after the last entry (before the first when there are none).
    cursor: str
    # More entries follow ``cursor`` than ``tail`` let through (``after`` only).
    more: bool
    status: str
    # Why the live container's output could not be read, if it could not.
    container_error: str | None


class LogListEnvelope(BaseModel):
    success: bool
    data: list[LogEntryOut]
    meta: LogMeta


_SSE = (
    "With follow=true: Server-Sent Events. Each `data:` is `{source, line, ts}` and each "
    "`id:` the entry's cursor (send it back as `Last-Event-ID`); `event: end` when the "
    "cluster is terminated; a `:` comment every 15 s."
)
# One event of the stream (OpenAPI 3.1 reads an event stream's schema per event).
_EVENT: dict[str, Any] = {
    "type": "object",
    "required": ["data", "event"],
    "properties": {
        "event": {"type": "string", "enum": ["message", "end"]},
        "id": {"type": "string", "pattern": CURSOR_PATTERN},
        "data": {
            "type": "string",
            "contentMediaType": "application/json",
            "contentSchema": {
                "type": "object",
                "properties": {
                    "source": {"type": "string", "enum": ["container", "system"]},
                    "line": {"type": "string"},
                    "ts": {"type": "string", "format": "date-time"},
                },
            },
        },
        "retry": {"type": "integer"},
    },
}
RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "model": LogListEnvelope,
        "description": "The entries, oldest first. " + _SSE,
        "content": {"text/event-stream": {"schema": _EVENT}},
    },
    204: {"description": "follow=true resumed on a terminated cluster: nothing more will come"},
}


def _since(value: str | None, request: Request) -> int:
    if value is None:
        return 0
    now = datetime_ns(app_state(request).ctx.clock.now())
    try:
        return parse_since(value, now)
    except ValueError as exc:
        raise ValidationFailed("since", str(exc)) from exc


def _cursor(value: str | None, field: str) -> Cursor | None:
    if value is None:
        return None
    try:
        return Cursor.parse(value)
    except ValueError as exc:
        raise ValidationFailed(field, str(exc)) from exc


@router.get("/v1/clusters/{cluster_id}/logs", responses=RESPONSES)
async def cluster_logs(
    cluster_id: str,
    request: Request,
    tail: int = Query(
        default=100, ge=0, le=MAX_TAIL, description="How many of the last entries (0-5000)."
    ),
    since: str | None = Query(
        default=None,
        max_length=64,
        description="Only entries from then on: RFC 3339, Unix seconds, or 30s/10m/2h/1d ago.",
        json_schema_extra={"pattern": SINCE_PATTERN},
    ),
    follow: bool = Query(default=False, description="Stream (SSE) and keep streaming."),
    after: str | None = Query(
        default=None,
        max_length=64,
        description="Resume after this cursor (an entry's id); then tail caps the count.",
        json_schema_extra={"pattern": CURSOR_PATTERN},
    ),
    last_event_id: str | None = Header(
        default=None,
        alias="Last-Event-ID",
        max_length=64,
        description="The SSE way to say `after` (browsers send it when they reconnect).",
        json_schema_extra={"pattern": CURSOR_PATTERN},
    ),
    principal: Principal = Depends(current_principal),
) -> Response:
    """A cluster's logs: its containers' output (``container``) and its events
    (``system``), oldest first. Stopped and errored clusters keep their containers'
    output (the last 5000 lines of each); a terminated cluster only its events."""
    since_ns = _since(since, request)
    from_query, from_header = _cursor(after, "after"), _cursor(last_event_id, "Last-Event-ID")
    resume = from_query or from_header
    state = app_state(request)
    ctx, runtime_of = state.ctx, state.runtime_of
    if resume is not None:
        limit = MAX_TAIL if follow else tail
        page = await run_in_threadpool(
            svc.read_after, ctx, principal, runtime_of, cluster_id, resume, limit=limit
        )
    else:
        page = await run_in_threadpool(
            svc.read_tail, ctx, principal, runtime_of, cluster_id, tail=tail, since_ns=since_ns
        )
    if not follow:
        return ok(
            [e.as_json() for e in page.entries],
            cursor=str(page.cursor),
            more=page.more,
            status=page.status,
            container_error=page.container_error,
        )
    finished = page.status == ClusterStatus.TERMINATED.value
    if resume is not None and finished and not page.entries:
        # EventSource clients stop reconnecting on a 204.
        return Response(status_code=204)
    return log_follow.respond(state, principal, cluster_id, page)
