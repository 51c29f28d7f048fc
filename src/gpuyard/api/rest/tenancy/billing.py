"""``GET /v1/billing``: what an account spent, by cluster, GPU type or day."""

from __future__ import annotations

from datetime import UTC, datetime

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from gpuyard.api.http.envelope import ok
from gpuyard.api.http.openapi_responses import ERROR_RESPONSES
from gpuyard.api.rest.schemas import responses as schemas
from gpuyard.api.rest.schemas.cluster_json import iso
from gpuyard.api.rest.schemas.responses import documented
from gpuyard.api.state import app_state, current_principal
from gpuyard.core.billing.ledger import METERS, MICRO
from gpuyard.core.errors import ValidationFailed
from gpuyard.core.input_rules import parse_id
from gpuyard.services.billing import metering
from gpuyard.services.billing.bills import caller_bill
from gpuyard.services.context import Context
from gpuyard.services.tenancy.auth import Principal

router = APIRouter(tags=["billing"], responses=ERROR_RESPONSES)


def parse_time(field: str, value: str | None, default: datetime) -> datetime:
    """An ISO 8601 date or datetime (naive means UTC); ``default`` when absent."""
    if value is None or value == "":
        return default
    try:
        t = datetime.fromisoformat(value.replace("Z", "+00:00").replace(" ", "+"))
    except ValueError as exc:
        raise ValidationFailed(
            field, f"{value!r} is not an ISO 8601 date or datetime (e.g. 2025-01-31T12:00:00Z)"
        ) from exc
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


def parse_project(value: str | None) -> int | None:
    """An optional project id, 1..MAX_DB_ID (a larger one would reach the store)."""
    return parse_id("project_id", value)


def parse_group_by(value: str | None) -> metering.GroupBy:
    try:
        return metering.GroupBy(value or "cluster")
    except ValueError as exc:
        raise ValidationFailed(
            "group_by",
            f"unknown grouping {value!r}",
            {"allowed": [g.value for g in metering.GroupBy]},
        ) from exc


def _usd(micro_usd: int) -> float:
    return micro_usd / MICRO


def billing_data(
    ctx: Context,
    principal: Principal,
    project: str | None,
    from_: str | None,
    to: str | None,
    group_by: str | None,
) -> dict[str, object]:
    now = ctx.clock.now()
    month_start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    start = parse_time("from", from_, month_start)
    end = parse_time("to", to, now)
    grouping = parse_group_by(group_by)
    project_id = parse_project(project)
    if end < start:
        raise ValidationFailed("to", "must not be before 'from'")
    bill = caller_bill(ctx, principal, project_id, start, end, grouping, now)
    totals = metering.meter_totals(bill.lines)
    return {
        "from": iso(bill.from_),
        "to": iso(bill.to),
        "group_by": grouping.value,
        "project_id": project_id,
        "currency": "USD",
        "total_usd": _usd(bill.total_micro),
        "breakdown": {m: _usd(totals[m]) for m in METERS},
        "items": [
            {
                "key": line.key,
                "name": line.label,
                "total_usd": _usd(line.micro),
                "gpu_hours": round(line.gpu_seconds / 3600, 6),
                "breakdown": {m: _usd(v) for m, v in line.meters_micro().items()},
            }
            for line in bill.lines
        ],
        "total_micro_usd": bill.total_micro,
    }


@router.get("/v1/billing", responses=documented(schemas.BillingEnvelope))
async def billing(
    request: Request,
    principal: Principal = Depends(current_principal),
) -> JSONResponse:
    """Spend of the key's account in ``[from, to)`` (ISO 8601; default: the start of
    the current UTC month until now), optionally of one ``project_id``, grouped by
    ``group_by`` = ``cluster`` (default), ``gpu_type`` or ``day`` (UTC). Usage is
    metered per second; each figure is rounded down to a micro-dollar."""
    q = request.query_params
    data = await run_in_threadpool(
        billing_data,
        app_state(request).ctx,
        principal,
        q.get("project_id"),
        q.get("from"),
        q.get("to"),
        q.get("group_by"),
    )
    return ok(data)
