"""The worker protocol's routes, under ``/runpod/v2/workers/{endpoint_id}/``
(services/serverless/worker_calls.py; the URLs a worker is given are
services/serverless/worker_env.py's):

- ``GET job-take/{worker_id}``: one job ``{id, input}``, or 204 when none came within
  ``serverless_job_take_wait_s`` (a long poll: the SDK asks again at once);
- ``GET job-take-batch/{worker_id}?batch_size=N``: a list of up to N jobs, or 204;
- ``GET job-stop/{worker_id}``: ``{"jobsToStop": [ids]}`` (cancelled or timed out
  while the worker held them), or 204 when none came within the same wait;
- ``POST job-stream/{worker_id}/{job_id}``: one streamed chunk ``{"output": ...}``;
- ``POST job-done/{worker_id}/{job_id}``: the result ``{"output": ...}`` or
  ``{"error": ...}`` (``isStream=true``: a generator's end, its output the aggregate or
  ``[]``);
- ``GET ping/{worker_id}``: alive (``starting`` becomes ``ready``); the jobs it reports
  running (``job_id``) tell which of its jobs never reached it (given back).

Only a worker's key (``Authorization: KEY``, as the SDK sends it) is accepted here, and
only on its own endpoint and worker id; an account's API key is no worker key (401).
These routes are not in the OpenAPI document: they are the workers', not the users'.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from gpuyard.api.http.json_body import OFF_LOOP_BYTES
from gpuyard.api.http.problems import RUNPOD_V2_PREFIX
from gpuyard.api.runpod_v2.serverless_jobs import RECHECK_S, wait_change
from gpuyard.api.state import app_state
from gpuyard.services.serverless import worker_calls as calls
from gpuyard.services.serverless.worker_env import WORKER_ROUTES_PREFIX

router = APIRouter(prefix=WORKER_ROUTES_PREFIX, include_in_schema=False)

RESULT_BODY_LIMIT = 20 * 1024 * 1024
MAX_BATCH = 64

assert WORKER_ROUTES_PREFIX.startswith(RUNPOD_V2_PREFIX + "/")


def _key(request: Request) -> str | None:
    raw = request.headers.get("authorization")
    if not raw:
        return None
    scheme, _, rest = raw.strip().partition(" ")
    return rest.strip() if scheme.lower() == "bearer" and rest else raw.strip()


async def _worker(request: Request, endpoint_id: str, worker_id: str) -> calls.WorkerRef:
    ctx = app_state(request).ctx
    return await run_in_threadpool(
        calls.authenticate_worker, ctx, _key(request), endpoint_id, worker_id
    )


async def _take(request: Request, worker: calls.WorkerRef, count: int) -> list[dict[str, object]]:
    """Jobs for the worker, waiting up to the long poll's time for the first."""
    ctx = app_state(request).ctx
    loop = asyncio.get_running_loop()
    deadline = loop.time() + ctx.settings.serverless_job_take_wait_s
    notifier = ctx.jobs_notifier
    while True:
        since = notifier.generation()
        jobs = await run_in_threadpool(calls.take, ctx, worker, count)
        left = deadline - loop.time()
        if jobs or left <= 0 or await request.is_disconnected():
            return jobs
        await wait_change(notifier, since, min(left, RECHECK_S))


async def _body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if len(raw) <= OFF_LOOP_BYTES:
        return calls.parse_body(raw)
    return await run_in_threadpool(calls.parse_body, raw)


@router.get("/{endpoint_id}/job-take/{worker_id}")
async def job_take(endpoint_id: str, worker_id: str, request: Request) -> Response:
    worker = await _worker(request, endpoint_id, worker_id)
    jobs = await _take(request, worker, 1)
    return JSONResponse(jobs[0]) if jobs else Response(status_code=204)


@router.get("/{endpoint_id}/job-take-batch/{worker_id}")
async def job_take_batch(
    endpoint_id: str,
    worker_id: str,
    request: Request,
    batch_size: int = Query(default=1, ge=1, le=10_000),
) -> Response:
    worker = await _worker(request, endpoint_id, worker_id)
    jobs = await _take(request, worker, min(batch_size, MAX_BATCH))
    return JSONResponse(jobs) if jobs else Response(status_code=204)


@router.get("/{endpoint_id}/job-stop/{worker_id}")
async def job_stop(endpoint_id: str, worker_id: str, request: Request) -> Response:
    worker = await _worker(request, endpoint_id, worker_id)
    ctx = app_state(request).ctx
    loop = asyncio.get_running_loop()
    deadline = loop.time() + ctx.settings.serverless_job_take_wait_s
    notifier = ctx.jobs_notifier
    while True:
        since = notifier.generation()
        ids = await run_in_threadpool(calls.stop_signals, ctx, worker)
        if ids:
            return JSONResponse({"jobsToStop": ids})
        left = deadline - loop.time()
        if left <= 0 or await request.is_disconnected():
            return Response(status_code=204)
        await wait_change(notifier, since, min(left, RECHECK_S))


@router.post("/{endpoint_id}/job-stream/{worker_id}/{job_id}")
async def job_stream(endpoint_id: str, worker_id: str, job_id: str, request: Request) -> Response:
    worker = await _worker(request, endpoint_id, worker_id)
    body = await _body(request)
    ctx = app_state(request).ctx
    seq = await run_in_threadpool(calls.job_stream, ctx, worker, job_id, body)
    return JSONResponse({"seq": seq})


@router.post("/{endpoint_id}/job-done/{worker_id}/{job_id}")
async def job_done(endpoint_id: str, worker_id: str, job_id: str, request: Request) -> Response:
    worker = await _worker(request, endpoint_id, worker_id)
    body = await _body(request)
    ctx = app_state(request).ctx
    status = await run_in_threadpool(calls.job_done, ctx, worker, job_id, body)
    return JSONResponse({"status": status})


@router.get("/{endpoint_id}/ping/{worker_id}")
async def ping(endpoint_id: str, worker_id: str, request: Request) -> Response:
    worker = await _worker(request, endpoint_id, worker_id)
    await run_in_threadpool(calls.ping, app_state(request).ctx, worker, reported_jobs(request))
    return Response(status_code=200)


def reported_jobs(request: Request) -> frozenset[str] | None:
    """The jobs a ping says its worker runs: runpod-python's heartbeat sends
    ``runpod_version`` always and ``job_id`` (comma-separated) while it runs any. None
    when the ping is not one that reports them."""
    query = request.query_params
    if "runpod_version" not in query:
        return None
    return frozenset(j.strip() for j in query.get("job_id", "").split(",") if j.strip())


def body_limit(method: str, path: str) -> int | None:
    """The body limit of a worker's result and chunks (20 MB), None for another path."""
    if method == "POST" and path.startswith(WORKER_ROUTES_PREFIX + "/"):
        parts = path.split("/")
        if len(parts) == 8 and parts[5] in ("job-done", "job-stream"):
            return RESULT_BODY_LIMIT
    return None
