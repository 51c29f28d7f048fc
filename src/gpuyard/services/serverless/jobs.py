"""Serverless jobs as an account sees them (RunPod's job API): submit, read, stream,
cancel, retry, purge the queue, the endpoint's health.

Every use case takes the acting principal: an endpoint of another account, of a project
the caller may not see, or with no endpoint id's shape answers 404 as if absent, and so
does a job of another endpoint. A finished job's result is kept
``serverless_result_ttl_s`` (30 minutes, as RunPod) after its end, for ``/run`` and
``/runsync`` alike; then the sweep deletes it (services/serverless/sweep.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from gpuyard.core.errors import InvalidState, NotFound, ValidationFailed
from gpuyard.core.ids import new_job_id
from gpuyard.core.serverless.jobs import JobStatus, delay_time_ms, execution_time_ms
from gpuyard.services.billing.admission import refuse_closed_account
from gpuyard.services.context import Context
from gpuyard.services.serverless.endpoints import live_endpoint
from gpuyard.services.serverless.queue import end_job, release_worker_slot
from gpuyard.services.serverless.webhooks import enqueue_job_webhook
from gpuyard.services.tenancy.auth import Principal
from gpuyard.store.schema.serverless import (
    ServerlessEndpoint,
    ServerlessJob,
    ServerlessJobChunk,
    ServerlessWorker,
)

# The longest execution timeout and ttl a policy may ask for (RunPod: 7 days / 24 h+).
MAX_TIMEOUT_MS = 7 * 24 * 3600 * 1000
MAX_JOB_ID = 64


@dataclass(frozen=True)
class JobRequest:
    """A validated ``/run`` body: the ``input`` as JSON text, the completion webhook,
    and the policy (``execution_timeout_ms`` None: the endpoint's; ``ttl_ms`` None:
    none)."""

    input_json: str
    webhook: str | None = None
    execution_timeout_ms: int | None = None
    low_priority: bool = False
    ttl_ms: int | None = None

    def __post_init__(self) -> None:
        if self.execution_timeout_ms is not None and not (
            0 <= self.execution_timeout_ms <= MAX_TIMEOUT_MS
        ):
            raise ValidationFailed(
                "policy.executionTimeout", f"must be 0 to {MAX_TIMEOUT_MS} milliseconds"
            )
        if self.ttl_ms is not None and not (1 <= self.ttl_ms <= MAX_TIMEOUT_MS):
            raise ValidationFailed("policy.ttl", f"must be 1 to {MAX_TIMEOUT_MS} milliseconds")


@dataclass(frozen=True)
class JobView:
    """One job as RunPod's status answer shows it."""

    id: str
    status: str
    delay_time_ms: int
    execution_time_ms: int
    worker_id: str | None
    output: Any = None
    has_output: bool = False
    error: str | None = None
    retried: int = 0

    def runpod(self) -> dict[str, Any]:
        """RunPod's ``{id, status, delayTime, executionTime, workerId, output | error}``."""
        body: dict[str, Any] = {"id": self.id, "status": self.status}
        body["delayTime"] = self.delay_time_ms
        if self.execution_time_ms or self.status != JobStatus.IN_QUEUE:
            body["executionTime"] = self.execution_time_ms
        if self.worker_id:
            body["workerId"] = self.worker_id
        if self.has_output:
            body["output"] = self.output
        if self.error is not None:
            body["error"] = self.error
        if self.retried:
            body["retries"] = self.retried
        return body


def job_view(job: ServerlessJob, now: datetime) -> JobView:
    """The status answer of ``job`` as of ``now``."""
    has_output = job.output_json is not None and job.status == JobStatus.COMPLETED
    if job.output_json is not None and job.status == JobStatus.FAILED:
        has_output = True
    return JobView(
        id=job.id,
        status=job.status,
        delay_time_ms=delay_time_ms(job.queued_at, job.started_at or job.completed_at, now),
        execution_time_ms=execution_time_ms(job.started_at, job.completed_at, now),
        worker_id=job.worker_id,
        output=json.loads(job.output_json) if has_output and job.output_json else None,
        has_output=has_output,
        error=job.error,
        retried=job.retried,
    )


@dataclass(frozen=True)
class PurgeResult:
    removed: int

    def runpod(self) -> dict[str, Any]:
        return {"removed": self.removed, "status": "completed"}


@dataclass(frozen=True)
class Health:
    completed: int
    failed: int
    in_progress: int
    in_queue: int
    retried: int
    idle: int
    running: int

    def runpod(self) -> dict[str, Any]:
        return {
            "jobs": {
                "completed": self.completed,
                "failed": self.failed,
                "inProgress": self.in_progress,
                "inQueue": self.in_queue,
                "retried": self.retried,
            },
            "workers": {"idle": self.idle, "running": self.running},
        }


# ----------------------------------------------------------------- finders


def _job(
    session: Session, endpoint: ServerlessEndpoint, job_id: str, *, lock: bool = False
) -> ServerlessJob:
    row = (
        session.get(ServerlessJob, job_id, with_for_update=lock, populate_existing=lock)
        if 0 < len(job_id) <= MAX_JOB_ID
        else None
    )
    if row is None or row.endpoint_id != endpoint.id or row.account_id != endpoint.account_id:
        raise NotFound(f"job {job_id[:80]!r} not found", {"job_id": job_id[:80]})
    return row


def finish(
    session: Session, job: ServerlessJob, status: JobStatus, now: datetime, keep_s: int
) -> None:
    """End ``job`` as ``status`` and queue its webhook. Runs inside the caller's
    transaction."""
    end_job(job, status, now, keep_s)
    enqueue_job_webhook(session, job, job_view(job, now).runpod(), now)


def recycle_worker(session: Session, worker_id: str | None, now: datetime) -> None:
    """Mark worker ``worker_id`` for replacement (its container still runs a job that
    ended without it). Runs inside the caller's transaction."""
    if worker_id is None:
        return
    session.execute(
        update(ServerlessWorker)
        .where(
            ServerlessWorker.id == worker_id,
            ServerlessWorker.status.in_(("starting", "ready")),
        )
        .values(status="recycle", updated_at=now)
        .execution_options(synchronize_session=False)
    )


# ---------------------------------------------------------------- use cases


def submit_job(
    ctx: Context, principal: Principal, endpoint_id: str, body: JobRequest, sync: bool
) -> JobView:
    """Queue a job on the caller's active endpoint. An account whose budget or prepaid
    balance is spent is refused (402 BUDGET_EXHAUSTED), a suspended one too (403).
    ``sync`` (``/runsync``) keeps the result as long as ``/run`` does; the caller waits
    with :func:`wait_for_end`."""
    del sync
    now = ctx.clock.now()
    with ctx.transaction() as session:
        endpoint = live_endpoint(session, principal, endpoint_id)
        refuse_closed_account(session, endpoint.account_id)
        timeout = (
            body.execution_timeout_ms
            if body.execution_timeout_ms is not None
            else endpoint.execution_timeout_ms
        )
        job = ServerlessJob(
            id=new_job_id(),
            endpoint_id=endpoint.id,
            account_id=endpoint.account_id,
            status=JobStatus.IN_QUEUE.value,
            input_json=body.input_json,
            webhook=body.webhook,
            execution_timeout_ms=timeout,
            low_priority=body.low_priority,
            ttl_ms=body.ttl_ms,
            attempt=0,
            retried=0,
            next_chunk=0,
            created_at=now,
            queued_at=now,
            updated_at=now,
        )
        session.add(job)
        session.flush()
        view = job_view(job, now)
    ctx.jobs_notifier.notify()
    ctx.wake()
    return view


def job_status(ctx: Context, principal: Principal, endpoint_id: str, job_id: str) -> JobView:
    """The job's status answer (its output once it completed)."""
    with ctx.read() as session:
        endpoint = live_endpoint(session, principal, endpoint_id, draining_ok=True)
        return job_view(_job(session, endpoint, job_id), ctx.clock.now())


def read_stream(
    ctx: Context, principal: Principal, endpoint_id: str, job_id: str
) -> tuple[JobView, list[Any]]:
    """The job's status and the chunks streamed since the last read, in order (RunPod's
    ``/stream``: each chunk is answered once)."""
    now = ctx.clock.now()
    with ctx.transaction() as session:
        endpoint = live_endpoint(session, principal, endpoint_id, draining_ok=True)
        job = _job(session, endpoint, job_id, lock=True)
        chunks = session.scalars(
            select(ServerlessJobChunk)
            .where(ServerlessJobChunk.job_id == job.id)
            .order_by(ServerlessJobChunk.seq)
        ).all()
        outputs = [json.loads(c.output_json) for c in chunks]
        if chunks:
            session.execute(
                delete(ServerlessJobChunk).where(
                    ServerlessJobChunk.job_id == job.id,
                    ServerlessJobChunk.seq <= chunks[-1].seq,
                )
            )
        return job_view(job, now), outputs


def cancel_job(ctx: Context, principal: Principal, endpoint_id: str, job_id: str) -> JobView:
    """Cancel a queued or running job (CANCELLED). A running job's worker is told to
    stop it (its stop channel) and marked ``recycle``: RunPod's workers run a handler
    to its end whatever the channel says, so the worker is replaced. A finished job is
    answered as it is."""
    now = ctx.clock.now()
    with ctx.transaction() as session:
        endpoint = live_endpoint(session, principal, endpoint_id, draining_ok=True)
        job = _job(session, endpoint, job_id, lock=True)
        if job.status == JobStatus.IN_PROGRESS:
            release_worker_slot(session, job.worker_id, now)
            recycle_worker(session, job.worker_id, now)
        if job.status in (JobStatus.IN_QUEUE, JobStatus.IN_PROGRESS):
            finish(session, job, JobStatus.CANCELLED, now, ctx.settings.serverless_result_ttl_s)
        view = job_view(job, now)
    ctx.jobs_notifier.notify()
    ctx.wake()
    return view


def retry_job(ctx: Context, principal: Principal, endpoint_id: str, job_id: str) -> JobView:
    """Put a FAILED, TIMED_OUT or CANCELLED job back in the queue with its input (as
    RunPod's ``/retry``): its result and streamed chunks are dropped, ``retried`` grows.
    Any other status is 409 INVALID_STATE."""
    now = ctx.clock.now()
    with ctx.transaction() as session:
        endpoint = live_endpoint(session, principal, endpoint_id)
        refuse_closed_account(session, endpoint.account_id)
        job = _job(session, endpoint, job_id, lock=True)
        retriable = (JobStatus.FAILED, JobStatus.TIMED_OUT, JobStatus.CANCELLED)
        if job.status not in retriable:
            raise InvalidState(
                f"job {job.id} is {job.status}: only FAILED, TIMED_OUT or CANCELLED jobs "
                "can be retried",
                {"status": job.status},
            )
        job.status = JobStatus.IN_QUEUE.value
        job.retried += 1
        job.output_json = None
        job.error = None
        job.worker_id = None
        job.started_at = None
        job.completed_at = None
        job.expires_at = None
        job.stop_sent_at = None
        job.queued_at = now
        job.created_at = now  # its ttl runs again from the retry
        job.updated_at = now
        session.execute(delete(ServerlessJobChunk).where(ServerlessJobChunk.job_id == job.id))
        view = job_view(job, now)
    ctx.jobs_notifier.notify()
    ctx.wake()
    return view


def purge_queue(ctx: Context, principal: Principal, endpoint_id: str) -> PurgeResult:
    """Cancel every job still in the endpoint's queue (running ones go on)."""
    now = ctx.clock.now()
    keep = ctx.settings.serverless_result_ttl_s
    with ctx.transaction() as session:
        endpoint = live_endpoint(session, principal, endpoint_id, draining_ok=True)
        result = session.execute(
            update(ServerlessJob)
            .where(
                ServerlessJob.endpoint_id == endpoint.id,
                ServerlessJob.status == JobStatus.IN_QUEUE.value,
            )
            .values(
                status=JobStatus.CANCELLED.value,
                completed_at=now,
                expires_at=now + timedelta(seconds=keep),
                updated_at=now,
            )
            .execution_options(synchronize_session=False)
        )
        removed = int(result.rowcount)  # type: ignore[attr-defined]
    ctx.jobs_notifier.notify()
    ctx.wake()
    return PurgeResult(removed=removed)


def endpoint_health(ctx: Context, principal: Principal, endpoint_id: str) -> Health:
    """The endpoint's job counts (finished ones while their results are kept) and its
    workers: ready and holding no job is idle; ready and busy, or starting, running."""
    with ctx.read() as session:
        endpoint = live_endpoint(session, principal, endpoint_id, draining_ok=True)
        counts: dict[str, int] = {
            status: int(count)
            for status, count in session.execute(
                select(ServerlessJob.status, func.count())
                .where(ServerlessJob.endpoint_id == endpoint.id)
                .group_by(ServerlessJob.status)
            )
        }
        retried = session.scalar(
            select(func.count()).where(
                ServerlessJob.endpoint_id == endpoint.id, ServerlessJob.retried > 0
            )
        )
        workers = session.execute(
            select(ServerlessWorker.status, ServerlessWorker.jobs_in_progress).where(
                ServerlessWorker.endpoint_id == endpoint.id,
                ServerlessWorker.status.in_(("starting", "ready")),
            )
        ).all()
    idle = sum(1 for status, busy in workers if status == "ready" and busy == 0)
    return Health(
        completed=int(counts.get(JobStatus.COMPLETED.value, 0)),
        failed=int(counts.get(JobStatus.FAILED.value, 0))
        + int(counts.get(JobStatus.TIMED_OUT.value, 0)),
        in_progress=int(counts.get(JobStatus.IN_PROGRESS.value, 0)),
        in_queue=int(counts.get(JobStatus.IN_QUEUE.value, 0)),
        retried=int(retried or 0),
        idle=idle,
        running=len(workers) - idle,
    )
