"""RunPod's job API under ``/runpod/v2/{endpoint_id}/`` (services/serverless/jobs.py):
``run``, ``runsync``, ``status/{job_id}``, ``stream/{job_id}``, ``cancel/{job_id}``,
``retry/{job_id}``, ``purge-queue``, ``health``, with RunPod's shapes, so
``runpod.Endpoint(id)`` works with ``RUNPOD_ENDPOINT_BASE_URL`` set to
``http://HOST:PORT/runpod/v2``.

An endpoint id never equals a collection name under the prefix (core/ids.py
``is_endpoint_id``), and this router is mounted after every collection's, so
``/runpod/v2/pods/...`` and the rest route as before; a path segment of no endpoint
id's shape is 404. Waits (``runsync``) are on the job notifier, off the event loop's
threads, and re-read the store at least every second (another replica's worker).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from fastapi import Depends, Query, Request
from fastapi.responses import JSONResponse
from pydantic import Field
from starlette.concurrency import run_in_threadpool

from gpuyard.api.runpod_v2.common import V2Body, answer, documented, v2_router
from gpuyard.api.state import app_state, current_principal
from gpuyard.core.serverless.jobs import is_final
from gpuyard.services.context import StatusNotifier
from gpuyard.services.serverless import jobs as svc
from gpuyard.services.tenancy.auth import Principal

router = v2_router()

RUN_BODY_LIMIT = 10 * 1024 * 1024
RUNSYNC_BODY_LIMIT = 20 * 1024 * 1024
DEFAULT_WAIT_MS = 90_000
MAX_WAIT_MS = 300_000
# A waiter re-reads the store at least this often (a change made by another replica
# rings no notifier here).
RECHECK_S = 1.0


class JobPolicy(V2Body):
    executionTimeout: int | None = Field(
        default=None, ge=0, le=svc.MAX_TIMEOUT_MS, strict=True, description="ms; 0: none"
    )
    lowPriority: bool | None = Field(default=None, strict=True)
    ttl: int | None = Field(default=None, ge=1, le=svc.MAX_TIMEOUT_MS, strict=True)


class RunRequest(V2Body):
    input: Any = Field(description="What the handler gets as job['input']")
    webhook: str | None = Field(
        default=None, max_length=2048, pattern=r"^https?://[^\s]+$", description="POSTed at the end"
    )
    policy: JobPolicy | None = None

    def job_request(self) -> svc.JobRequest:
        policy = self.policy or JobPolicy()
        return svc.JobRequest(
            input_json=json.dumps(self.input),
            webhook=self.webhook,
            execution_timeout_ms=policy.executionTimeout,
            low_priority=bool(policy.lowPriority),
            ttl_ms=policy.ttl,
        )


async def wait_change(notifier: StatusNotifier, since: int, timeout_s: float) -> None:
    """Return when ``notifier`` rings after generation ``since``, or after
    ``timeout_s``; the event loop is never blocked."""
    loop = asyncio.get_running_loop()
    event = asyncio.Event()

    def ring() -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(event.set)

    notifier.listen(ring)
    try:
        if notifier.generation() != since or timeout_s <= 0:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout_s)
    finally:
        notifier.unlisten(ring)


@router.post("/{endpoint_id}/run", responses=documented("{id, status}"))
async def run(
    endpoint_id: str,
    body: RunRequest,
    request: Request,
    principal: Principal = Depends(current_principal),
) -> JSONResponse:
    """Queue a job (up to 10 MB); its result is kept 30 minutes after it ends."""
    ctx = app_state(request).ctx
    view = await run_in_threadpool(
        svc.submit_job, ctx, principal, endpoint_id, body.job_request(), False
    )
    return answer({"id": view.id, "status": view.status})


@router.post("/{endpoint_id}/runsync", responses=documented("The job's status answer"))
async def runsync(
    endpoint_id: str,
    body: RunRequest,
    request: Request,
    wait: int = Query(default=DEFAULT_WAIT_MS, ge=0, le=MAX_WAIT_MS, description="ms"),
    principal: Principal = Depends(current_principal),
) -> JSONResponse:
    """Queue a job (up to 20 MB) and answer when it ends or ``wait`` ms passed (the
    status answer then says IN_QUEUE or IN_PROGRESS: poll ``status``)."""
    ctx = app_state(request).ctx
    view = await run_in_threadpool(
        svc.submit_job, ctx, principal, endpoint_id, body.job_request(), True
    )
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait / 1000
    notifier = ctx.jobs_notifier
    while not is_final(view.status):
        left = deadline - loop.time()
        if left <= 0:
            break
        since = notifier.generation()
        view = await run_in_threadpool(svc.job_status, ctx, principal, endpoint_id, view.id)
        if is_final(view.status):
            break
        await wait_change(notifier, since, min(left, RECHECK_S))
    return answer(view.runpod())


@router.get("/{endpoint_id}/status/{job_id}", responses=documented("The job's status answer"))
async def status(
    endpoint_id: str,
    job_id: str,
    request: Request,
    principal: Principal = Depends(current_principal),
) -> JSONResponse:
    """``{id, status, delayTime, executionTime, workerId, output | error}``."""
    ctx = app_state(request).ctx
    view = await run_in_threadpool(svc.job_status, ctx, principal, endpoint_id, job_id)
    return answer(view.runpod())


@router.get("/{endpoint_id}/stream/{job_id}", responses=documented("{id, status, stream}"))
async def stream(
    endpoint_id: str,
    job_id: str,
    request: Request,
    principal: Principal = Depends(current_principal),
) -> JSONResponse:
    """The chunks streamed since the last read (``stream: [{output}]``), each answered
    once, and the job's status."""
    ctx = app_state(request).ctx
    view, chunks = await run_in_threadpool(svc.read_stream, ctx, principal, endpoint_id, job_id)
    body: dict[str, Any] = {
        "id": view.id,
        "status": view.status,
        "stream": [{"output": chunk} for chunk in chunks],
    }
    if view.error is not None:
        body["error"] = view.error
    return answer(body)


@router.post("/{endpoint_id}/cancel/{job_id}", responses=documented("{id, status}"))
async def cancel(
    endpoint_id: str,
    job_id: str,
    request: Request,
    principal: Principal = Depends(current_principal),
) -> JSONResponse:
    """Cancel a queued or running job (a running one's worker is stopped)."""
    ctx = app_state(request).ctx
    view = await run_in_threadpool(svc.cancel_job, ctx, principal, endpoint_id, job_id)
    return answer({"id": view.id, "status": view.status})


@router.post("/{endpoint_id}/retry/{job_id}", responses=documented("{id, status}"))
async def retry(
    endpoint_id: str,
    job_id: str,
    request: Request,
    principal: Principal = Depends(current_principal),
) -> JSONResponse:
    """Queue a FAILED, TIMED_OUT or CANCELLED job again with its input."""
    ctx = app_state(request).ctx
    view = await run_in_threadpool(svc.retry_job, ctx, principal, endpoint_id, job_id)
    return answer({"id": view.id, "status": view.status})


@router.post("/{endpoint_id}/purge-queue", responses=documented("{removed, status}"))
async def purge_queue(
    endpoint_id: str, request: Request, principal: Principal = Depends(current_principal)
) -> JSONResponse:
    """Cancel every queued job of the endpoint; running ones go on."""
    ctx = app_state(request).ctx
    result = await run_in_threadpool(svc.purge_queue, ctx, principal, endpoint_id)
    return answer(result.runpod())


@router.get("/{endpoint_id}/health", responses=documented("{jobs, workers}"))
async def health(
    endpoint_id: str, request: Request, principal: Principal = Depends(current_principal)
) -> JSONResponse:
    """``{jobs: {completed, failed, inProgress, inQueue, retried}, workers: {idle,
    running}}``."""
    ctx = app_state(request).ctx
    result = await run_in_threadpool(svc.endpoint_health, ctx, principal, endpoint_id)
    return answer(result.runpod())


def body_limit(method: str, path: str) -> int | None:
    """The body limit of a job route (``run`` 10 MB, ``runsync`` 20 MB), None for
    another path."""
    if method != "POST" or not path.startswith("/runpod/v2/"):
        return None
    parts = path.split("/")
    if len(parts) != 5:
        return None
    if parts[4] == "run":
        return RUN_BODY_LIMIT
    if parts[4] == "runsync":
        return RUNSYNC_BODY_LIMIT
    return None
