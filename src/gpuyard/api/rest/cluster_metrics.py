"""``GET /v1/clusters/{id}/metrics?window=1h``: the cluster's CPU, memory and GPU
utilisation (percent) over the window, oldest first, as the reconciler sampled them
(reconciler/duties/utilization.py; an hour is kept). ``gpu_percent`` is null where the GPUs
could not be read (a machine without GPUs): no data, not zero. Reads only; another
account's cluster is ``404 CLUSTER_NOT_FOUND``; a window that is not 1-60 minutes
(``5m``, ``30m``, ``1h``) is ``400 VALIDATION_ERROR`` naming ``window``."""

from __future__ import annotations

import re
from datetime import timedelta

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse

from gpuyard.api.http.envelope import ok
from gpuyard.api.http.openapi_responses import ERROR_RESPONSES
from gpuyard.api.rest.schemas.cluster_json import iso
from gpuyard.api.state import app_state, current_principal
from gpuyard.core.errors import ValidationFailed
from gpuyard.services.clusters.reads import utilization_samples
from gpuyard.services.tenancy.auth import Principal

router = APIRouter(tags=["clusters"], responses=ERROR_RESPONSES)

_WINDOW = re.compile(r"^(\d{1,3})(m|h)$")
MOST = timedelta(hours=1)


def parse_window(text: str) -> timedelta:
    m = _WINDOW.match(text)
    span = None
    if m is not None:
        n = int(m.group(1))
        span = timedelta(minutes=n) if m.group(2) == "m" else timedelta(hours=n)
    if span is None or span <= timedelta(0) or span > MOST:
        raise ValidationFailed("window", "a span of 1 to 60 minutes, such as 5m, 30m or 1h")
    return span


@router.get("/v1/clusters/{cluster_id}/metrics")
def cluster_metrics(
    cluster_id: str,
    request: Request,
    window: str = Query("1h", max_length=8),
    principal: Principal = Depends(current_principal),
) -> JSONResponse:
    """Utilisation samples of the caller's cluster over ``window`` (default 1h)."""
    span = parse_window(window)
    rows = utilization_samples(app_state(request).ctx, principal, cluster_id, span)
    samples = [
        {
            "at": iso(r.at),
            "cpu_percent": r.cpu_percent,
            "memory_percent": r.memory_percent,
            "gpu_percent": r.gpu_percent,
        }
        for r in rows
    ]
    return ok(
        {
            "cluster_id": cluster_id,
            "window_s": int(span.total_seconds()),
            "samples": samples,
            "gpu_data": any(s["gpu_percent"] is not None for s in samples),
        }
    )
