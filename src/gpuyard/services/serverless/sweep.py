"""What the reconciler's pass does to the queue with nobody asking: silent workers'
jobs back to the queue, jobs past their execution timeout or ttl ended, old results
forgotten. Each concern is one short transaction; the clock is the caller's.

- A worker (``starting`` or ``ready``) that has not pinged for
  ``serverless_worker_ping_timeout_s`` (a starting one: ``serverless_worker_start_grace_s``
  from its creation before its first ping) gives its jobs back (give_back_jobs: requeued
  up to ``serverless_job_max_retries`` times, then FAILED) and becomes ``recycle``: the
  workers' duty stops its cluster and starts another.
- An IN_PROGRESS job past its execution timeout (from ``started_at``) ends TIMED_OUT and
  its worker becomes ``recycle`` (it still runs the handler); the worker's stop channel
  answers the job's id.
- A job past its ``ttl`` (from submission, queue and run together, as RunPod counts it)
  ends TIMED_OUT with the error ``ttl expired``, whether queued or running; RunPod drops
  such a job, gpuyard keeps its status readable until the result would expire, so a
  client polling it learns why it never ran.
- A finished job whose ``expires_at`` passed is deleted with its chunks.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, or_, select

from gpuyard.core.serverless.jobs import FINAL_STATUSES, JobStatus
from gpuyard.services.context import Context
from gpuyard.services.serverless.jobs import finish, recycle_worker
from gpuyard.services.serverless.queue import give_back_jobs, release_worker_slot
from gpuyard.store.schema.serverless import ServerlessJob, ServerlessJobChunk, ServerlessWorker

DELETE_BATCH = 500


@dataclass(frozen=True)
class SweepResult:
    silent_workers: tuple[str, ...] = ()
    requeued_or_failed: int = 0
    timed_out: int = 0
    ttl_expired: int = 0
    deleted: int = 0

    @property
    def changed(self) -> bool:
        return bool(
            self.silent_workers
            or self.requeued_or_failed
            or self.timed_out
            or self.ttl_expired
            or self.deleted
        )


def _silent(worker: ServerlessWorker, now: datetime, ping_s: int, grace_s: int) -> bool:
    if worker.last_ping_at is None:
        return now - worker.created_at > timedelta(seconds=grace_s)
    return now - worker.last_ping_at > timedelta(seconds=ping_s)


def _sweep_workers(ctx: Context, now: datetime) -> tuple[tuple[str, ...], int]:
    settings = ctx.settings
    ping_s = settings.serverless_worker_ping_timeout_s
    grace_s = settings.serverless_worker_start_grace_s
    with ctx.read() as session:
        live = session.scalars(
            select(ServerlessWorker).where(ServerlessWorker.status.in_(("starting", "ready")))
        ).all()
        silent = [w.id for w in live if _silent(w, now, ping_s, grace_s)]
    given = 0
    for worker_id in silent:
        with ctx.transaction() as session:
            row = session.get(
                ServerlessWorker, worker_id, with_for_update=True, populate_existing=True
            )
            if row is None or row.status not in ("starting", "ready"):
                continue
            if not _silent(row, now, ping_s, grace_s):
                continue
            reason = f"worker {worker_id} stopped answering (no ping for {ping_s} s)"
            given += give_back_jobs(
                session,
                worker_id,
                reason,
                now,
                max_retries=settings.serverless_job_max_retries,
                keep_s=settings.serverless_result_ttl_s,
            )
            recycle_worker(session, worker_id, now)
    return tuple(silent), given


def _past(job: ServerlessJob, now: datetime) -> str | None:
    """Why ``job`` must end now (None: it may go on)."""
    if job.ttl_ms and now - job.created_at > timedelta(milliseconds=job.ttl_ms):
        return "ttl"
    if (
        job.status == JobStatus.IN_PROGRESS
        and job.execution_timeout_ms
        and job.started_at is not None
        and now - job.started_at > timedelta(milliseconds=job.execution_timeout_ms)
    ):
        return "timeout"
    return None


def _sweep_deadlines(ctx: Context, now: datetime) -> tuple[int, int]:
    with ctx.read() as session:
        candidates = session.scalars(
            select(ServerlessJob.id).where(
                or_(
                    ServerlessJob.status == JobStatus.IN_PROGRESS.value,
                    (ServerlessJob.status == JobStatus.IN_QUEUE.value)
                    & ServerlessJob.ttl_ms.is_not(None),
                )
            )
        ).all()
    timed_out = ttl = 0
    keep = ctx.settings.serverless_result_ttl_s
    for job_id in candidates:
        with ctx.transaction() as session:
            job = session.get(ServerlessJob, job_id, with_for_update=True, populate_existing=True)
            if job is None or job.status not in (JobStatus.IN_QUEUE, JobStatus.IN_PROGRESS):
                continue
            why = _past(job, now)
            if why is None:
                continue
            if job.status == JobStatus.IN_PROGRESS:
                release_worker_slot(session, job.worker_id, now)
                recycle_worker(session, job.worker_id, now)
            if why == "ttl":
                job.error = "ttl expired"
                ttl += 1
            else:
                job.error = f"execution timeout ({job.execution_timeout_ms} ms) exceeded"
                timed_out += 1
            finish(session, job, JobStatus.TIMED_OUT, now, keep)
    return timed_out, ttl


def _sweep_expired(ctx: Context, now: datetime) -> int:
    deleted = 0
    while True:
        with ctx.transaction() as session:
            ids = session.scalars(
                select(ServerlessJob.id)
                .where(
                    ServerlessJob.expires_at.is_not(None),
                    ServerlessJob.expires_at < now,
                    ServerlessJob.status.in_([s.value for s in FINAL_STATUSES]),
                )
                .limit(DELETE_BATCH)
            ).all()
            if not ids:
                return deleted
            session.execute(delete(ServerlessJobChunk).where(ServerlessJobChunk.job_id.in_(ids)))
            session.execute(delete(ServerlessJob).where(ServerlessJob.id.in_(ids)))
            deleted += len(ids)


def sweep(ctx: Context, now: datetime) -> SweepResult:
    """One pass over the queue as of ``now``."""
    silent, given = _sweep_workers(ctx, now)
    timed_out, ttl = _sweep_deadlines(ctx, now)
    deleted = _sweep_expired(ctx, now)
    result = SweepResult(silent, given, timed_out, ttl, deleted)
    if result.changed:
        ctx.jobs_notifier.notify()
    return result
