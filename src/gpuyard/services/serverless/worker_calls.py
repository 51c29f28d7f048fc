"""The worker protocol, as the unmodified runpod-python serverless worker speaks it:
take jobs, post streamed chunks and the result, ping, and poll the stop channel.

A worker is known by its key alone (``RUNPOD_AI_API_KEY``, sent as the bare
``Authorization`` header; looked up by its SHA-256), and that key works for its own
worker id and endpoint only: another endpoint's or worker's path is 403, an unknown key
or a worker that is gone 401. A result or chunk for a job the worker does not hold now
(never taken, given back to the queue and taken by another, cancelled, timed out) is
refused (409) and never overwrites anything.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from gpuyard.core.errors import Forbidden, InvalidState, Unauthorized, ValidationFailed
from gpuyard.core.ids import worker_key_hash
from gpuyard.core.serverless.jobs import JobStatus
from gpuyard.services.context import Context
from gpuyard.services.serverless.jobs import finish, recycle_worker
from gpuyard.services.serverless.queue import give_back_jobs, release_worker_slot, take_jobs
from gpuyard.store.schema.serverless import ServerlessJob, ServerlessJobChunk, ServerlessWorker

# Statuses of a worker whose key is no longer accepted.
_REFUSED = ("gone",)
# How long a cancelled or timed-out job's id is answered on its worker's stop channel.
STOP_WINDOW_S = 300
MAX_KEY = 200


@dataclass(frozen=True)
class WorkerRef:
    """An authenticated worker."""

    id: str
    endpoint_id: str


def worker_for_key(session: Session, key: str) -> ServerlessWorker | None:
    """The worker holding ``key`` (None: no worker does). Runs inside the caller's
    transaction."""
    if not key or len(key) > MAX_KEY:
        return None
    return session.scalar(
        select(ServerlessWorker).where(ServerlessWorker.key_hash == worker_key_hash(key))
    )


def authenticate_worker(
    ctx: Context, key: str | None, endpoint_id: str, worker_id: str | None
) -> WorkerRef:
    """The worker of ``key``, when it is worker ``worker_id`` (None: any) of
    ``endpoint_id``. Raises Unauthorized (unknown key, a worker that is gone) or
    Forbidden (another worker's or endpoint's path)."""
    with ctx.read() as session:
        row = worker_for_key(session, key or "")
        if row is None or row.status in _REFUSED:
            raise Unauthorized("not a serverless worker's key")
        if row.endpoint_id != endpoint_id or (worker_id is not None and row.id != worker_id):
            raise Forbidden("this worker's key serves its own endpoint and worker id only")
        return WorkerRef(id=row.id, endpoint_id=row.endpoint_id)


def _job_input(job: ServerlessJob) -> dict[str, Any]:
    return {"id": job.id, "input": json.loads(job.input_json)}


def take(ctx: Context, worker: WorkerRef, max_jobs: int) -> list[dict[str, Any]]:
    """Up to ``max_jobs`` jobs handed to the worker now (``[]``: none queued, or the
    worker no longer takes jobs), each as the SDK reads it: ``{id, input}``."""
    now = ctx.clock.now()
    with ctx.read() as session:
        # A poll of an empty queue takes no write lock (SQLite has one for the database).
        waiting = session.scalar(
            select(ServerlessJob.id)
            .where(
                ServerlessJob.endpoint_id == worker.endpoint_id,
                ServerlessJob.status == JobStatus.IN_QUEUE.value,
            )
            .limit(1)
        )
    if waiting is None:
        return []
    with ctx.transaction() as session:
        row = session.get(ServerlessWorker, worker.id, populate_existing=True)
        if row is None:
            return []
        jobs = take_jobs(session, row, max_jobs, now)
        return [_job_input(job) for job in jobs]


# A job handed out this recently may be missing from a ping that was on its way (the
# SDK adds a job to its list as soon as the take answers, and pings every 10 s).
REPORT_GRACE_S = 30


def ping(ctx: Context, worker: WorkerRef, reported: frozenset[str] | None = None) -> int:
    """The worker is alive: a starting worker becomes ready (its idle time starts).

    ``reported``: the jobs the worker says it is running (runpod-python's heartbeat
    sends them with each ping; None when the ping says nothing about its jobs). When it
    names at least one job, a job it holds here, handed out more than
    :data:`REPORT_GRACE_S` ago, that it does not name never reached it (the long poll's
    connection died before the answer) or was lost: it goes back to the queue at once
    rather than waiting for its execution timeout. An empty report gives nothing back:
    SDK versions whose heartbeat process cannot see the job list always send none, and
    their jobs must not be taken from them. Returns how many went back."""
    now = ctx.clock.now()
    given = 0
    with ctx.transaction() as session:
        row = session.get(ServerlessWorker, worker.id, populate_existing=True)
        if row is None:
            return 0
        row.last_ping_at = now
        row.updated_at = now
        became_ready = row.status == "starting"
        if became_ready:
            row.status = "ready"
            row.last_busy_at = row.last_busy_at or now
        if reported and row.jobs_in_progress > 0:
            given = _give_back_unreported(ctx, session, worker, reported, now)
    if became_ready or given:
        ctx.wake()  # the scaler counts it as ready now / the jobs wait again
    return given


def _give_back_unreported(
    ctx: Context, session: Session, worker: WorkerRef, reported: frozenset[str], now: datetime
) -> int:
    handed_before = now - timedelta(seconds=REPORT_GRACE_S)
    unreported = [
        job_id
        for job_id, started_at in session.execute(
            select(ServerlessJob.id, ServerlessJob.started_at).where(
                ServerlessJob.worker_id == worker.id,
                ServerlessJob.status == JobStatus.IN_PROGRESS.value,
            )
        )
        if job_id not in reported and started_at is not None and started_at < handed_before
    ]
    if not unreported:
        return 0
    settings = ctx.settings
    return give_back_jobs(
        session,
        worker.id,
        f"worker {worker.id} no longer reported the job",
        now,
        max_retries=settings.serverless_job_max_retries,
        keep_s=settings.serverless_result_ttl_s,
        only=frozenset(unreported),
    )


def _held(session: Session, worker: WorkerRef, job_id: str) -> ServerlessJob:
    job = session.get(ServerlessJob, job_id, with_for_update=True, populate_existing=True)
    if (
        job is None
        or job.endpoint_id != worker.endpoint_id
        or job.worker_id != worker.id
        or job.status != JobStatus.IN_PROGRESS
    ):
        raise InvalidState(
            f"job {job_id[:80]!r} is not held by worker {worker.id}", {"job_id": job_id[:80]}
        )
    return job


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def parse_body(raw: bytes) -> dict[str, Any]:
    """A worker's posted JSON object (the SDK sends it form-encoded by its header, JSON
    by its bytes). Raises ValidationFailed."""
    try:
        body = json.loads(raw or b"null")
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValidationFailed("body", "not JSON") from exc
    if not isinstance(body, dict):
        raise ValidationFailed("body", "must be a JSON object")
    return body


def job_done(ctx: Context, worker: WorkerRef, job_id: str, body: dict[str, Any]) -> str:
    """The worker's result of a job it holds: ``{"output": ...}`` completes it,
    ``{"error": ...}`` fails it (the output sent beside an error is kept);
    ``stopPod: true`` (the SDK's ``refresh_worker``) has the worker replaced. Returns
    the job's new status."""
    now = ctx.clock.now()
    with ctx.transaction() as session:
        job = _held(session, worker, job_id)
        if "output" in body:
            job.output_json = json.dumps(body["output"])
        failed = body.get("error") not in (None, "")
        if failed:
            job.error = _text(body["error"])
        release_worker_slot(session, worker.id, now)
        if body.get("stopPod") is True:
            recycle_worker(session, worker.id, now)
        status = JobStatus.FAILED if failed else JobStatus.COMPLETED
        finish(session, job, status, now, ctx.settings.serverless_result_ttl_s)
    ctx.jobs_notifier.notify()
    ctx.wake()
    return status.value


def job_stream(ctx: Context, worker: WorkerRef, job_id: str, body: dict[str, Any]) -> int:
    """One streamed chunk (``{"output": ...}``) of a job the worker holds, appended
    after the ones before; returns its sequence number."""
    if "output" not in body:
        raise ValidationFailed("output", 'a streamed chunk is {"output": ...}')
    now = ctx.clock.now()
    with ctx.transaction() as session:
        job = _held(session, worker, job_id)
        seq = job.next_chunk
        job.next_chunk = seq + 1
        job.updated_at = now
        session.add(
            ServerlessJobChunk(
                job_id=job.id, seq=seq, output_json=json.dumps(body["output"]), created_at=now
            )
        )
    ctx.jobs_notifier.notify()
    return seq


def stop_signals(ctx: Context, worker: WorkerRef) -> list[str]:
    """The worker's jobs it must stop, each answered once: cancelled or timed out while
    it held them (in the last ``STOP_WINDOW_S``)."""
    now = ctx.clock.now()
    since = now - timedelta(seconds=STOP_WINDOW_S)
    with ctx.transaction() as session:
        ids = list(
            session.scalars(
                select(ServerlessJob.id).where(
                    ServerlessJob.worker_id == worker.id,
                    ServerlessJob.status.in_(
                        (JobStatus.CANCELLED.value, JobStatus.TIMED_OUT.value)
                    ),
                    ServerlessJob.completed_at >= since,
                    ServerlessJob.started_at.is_not(None),
                    ServerlessJob.stop_sent_at.is_(None),
                )
            )
        )
        if ids:
            session.execute(
                update(ServerlessJob)
                .where(ServerlessJob.id.in_(ids))
                .values(stop_sent_at=now)
                .execution_options(synchronize_session=False)
            )
        return ids


def mark_worker(session: Session, worker_id: str, status: str, now: datetime) -> None:
    """Set worker ``worker_id``'s status. Runs inside the caller's transaction."""
    session.execute(
        update(ServerlessWorker)
        .where(ServerlessWorker.id == worker_id)
        .values(status=status, updated_at=now)
        .execution_options(synchronize_session=False)
    )
