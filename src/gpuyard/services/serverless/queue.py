"""The durable job queue: handing queued jobs to workers exactly once, giving a lost
worker's jobs back, and the queue's figures the scaler reads.

Exactly once: on PostgreSQL the queued rows are read ``FOR UPDATE SKIP LOCKED``, so
two takers never see the same row (each skips what the other holds) and neither waits;
on SQLite the write transaction holds the database's write lock from its first
statement (store/db.py), and each hand-out is still a conditional ``UPDATE ... WHERE
status = 'IN_QUEUE'`` whose row count says whether this taker got it. Every function
here runs inside the caller's transaction.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import UTC, datetime, timedelta

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from gpuyard.core.serverless.jobs import JobStatus
from gpuyard.core.serverless.scaling import QueueState
from gpuyard.store.schema.serverless import ServerlessJob, ServerlessJobChunk, ServerlessWorker

# Worker statuses that may take new jobs.
TAKING_STATUSES = ("starting", "ready")


def _is_postgres(session: Session) -> bool:
    return session.get_bind().dialect.name == "postgresql"


def take_jobs(
    session: Session, worker: ServerlessWorker, max_jobs: int, now: datetime
) -> list[ServerlessJob]:
    """Hand up to ``max_jobs`` queued jobs of the worker's endpoint to ``worker``
    (low priority last, then oldest first): each becomes IN_PROGRESS under this worker
    with its ``attempt`` one higher and ``started_at`` now; the worker's
    ``jobs_in_progress`` grows by what it got. A job is handed to one taker only, however
    many take at once. Runs inside the caller's transaction."""
    if max_jobs <= 0 or worker.status not in TAKING_STATUSES:
        return []
    order = (ServerlessJob.low_priority, ServerlessJob.queued_at, ServerlessJob.id)
    queued = select(ServerlessJob).where(
        ServerlessJob.endpoint_id == worker.endpoint_id,
        ServerlessJob.status == JobStatus.IN_QUEUE.value,
    )
    taken: list[ServerlessJob] = []
    if _is_postgres(session):
        rows = session.scalars(
            queued.order_by(*order).limit(max_jobs).with_for_update(skip_locked=True)
        ).all()
        for job in rows:
            _hand_out(job, worker, now)
            taken.append(job)
    else:
        ids = session.scalars(
            select(ServerlessJob.id)
            .where(
                ServerlessJob.endpoint_id == worker.endpoint_id,
                ServerlessJob.status == JobStatus.IN_QUEUE.value,
            )
            .order_by(*order)
            .limit(max_jobs)
        ).all()
        for job_id in ids:
            result = session.execute(
                update(ServerlessJob)
                .where(ServerlessJob.id == job_id, ServerlessJob.status == JobStatus.IN_QUEUE.value)
                .values(
                    status=JobStatus.IN_PROGRESS.value,
                    worker_id=worker.id,
                    attempt=ServerlessJob.attempt + 1,
                    started_at=now,
                    updated_at=now,
                )
                .execution_options(synchronize_session=False)
            )
            if result.rowcount == 1:  # type: ignore[attr-defined]
                got = session.get(ServerlessJob, job_id, populate_existing=True)
                if got is not None:
                    taken.append(got)
    if taken:
        session.execute(
            update(ServerlessWorker)
            .where(ServerlessWorker.id == worker.id)
            .values(
                jobs_in_progress=ServerlessWorker.jobs_in_progress + len(taken),
                last_busy_at=now,
                updated_at=now,
            )
            .execution_options(synchronize_session=False)
        )
    return taken


def _hand_out(job: ServerlessJob, worker: ServerlessWorker, now: datetime) -> None:
    job.status = JobStatus.IN_PROGRESS.value
    job.worker_id = worker.id
    job.attempt += 1
    job.started_at = now
    job.updated_at = now


def release_worker_slot(session: Session, worker_id: str | None, now: datetime) -> None:
    """One job fewer held by ``worker_id`` (never below zero); idle time runs from now.
    Runs inside the caller's transaction."""
    if worker_id is None:
        return
    session.execute(
        update(ServerlessWorker)
        .where(ServerlessWorker.id == worker_id)
        .values(
            jobs_in_progress=func.max(ServerlessWorker.jobs_in_progress - 1, 0)
            if not _is_postgres(session)
            else func.greatest(ServerlessWorker.jobs_in_progress - 1, 0),
            last_busy_at=now,
            updated_at=now,
        )
        .execution_options(synchronize_session=False)
    )


def end_job(
    job: ServerlessJob,
    status: JobStatus,
    now: datetime,
    keep_s: int,
    *,
    error: str | None = None,
) -> None:
    """Move ``job`` to the final ``status`` (its result kept ``keep_s`` seconds)."""
    job.status = status.value
    job.completed_at = now
    job.expires_at = now + timedelta(seconds=keep_s)
    job.updated_at = now
    if error is not None:
        job.error = error


def give_back_jobs(
    session: Session,
    worker_id: str,
    reason: str,
    now: datetime,
    max_retries: int = 3,
    keep_s: int = 1800,
    only: Collection[str] | None = None,
) -> int:
    """The jobs worker ``worker_id`` holds (those of ``only``, when given) go back to
    the queue (``retried`` one higher), or end FAILED with ``reason`` once they were
    given back ``max_retries`` times (kept ``keep_s`` seconds); the worker's count of
    held jobs follows. A job given back keeps its ``queued_at`` (its first entry in the
    queue), so its ``delayTime`` counts every wait it had and the QUEUE_DELAY scaler
    sees how long it has really waited; its streamed chunks of the lost attempt are
    dropped. Returns how many were requeued or failed. Runs inside the caller's
    transaction."""
    held = session.scalars(
        select(ServerlessJob)
        .where(
            ServerlessJob.worker_id == worker_id,
            ServerlessJob.status == JobStatus.IN_PROGRESS.value,
        )
        .with_for_update()
    ).all()
    lost = [job for job in held if only is None or job.id in only]
    for job in lost:
        if job.retried >= max_retries:
            end_job(job, JobStatus.FAILED, now, keep_s, error=reason)
            continue
        job.status = JobStatus.IN_QUEUE.value
        job.retried += 1
        job.worker_id = None
        job.started_at = None
        job.updated_at = now
        session.execute(delete(ServerlessJobChunk).where(ServerlessJobChunk.job_id == job.id))
    session.execute(
        update(ServerlessWorker)
        .where(ServerlessWorker.id == worker_id)
        .values(jobs_in_progress=len(held) - len(lost), updated_at=now)
        .execution_options(synchronize_session=False)
    )
    return len(lost)


def queue_state(session: Session, endpoint_id: str, now: datetime) -> QueueState:
    """How many jobs of the endpoint wait and run, and when the oldest waiting one
    entered the queue. Runs inside the caller's transaction."""
    del now  # the figures are the store's as of this transaction
    rows = session.execute(
        select(ServerlessJob.status, func.count(), func.min(ServerlessJob.queued_at))
        .where(
            ServerlessJob.endpoint_id == endpoint_id,
            ServerlessJob.status.in_((JobStatus.IN_QUEUE.value, JobStatus.IN_PROGRESS.value)),
        )
        .group_by(ServerlessJob.status)
    ).all()
    counts = {status: (int(count), oldest) for status, count, oldest in rows}
    in_queue, oldest = counts.get(JobStatus.IN_QUEUE.value, (0, None))
    in_progress, _ = counts.get(JobStatus.IN_PROGRESS.value, (0, None))
    if oldest is not None and oldest.tzinfo is None:
        oldest = oldest.replace(tzinfo=UTC)
    return QueueState(in_queue=in_queue, in_progress=in_progress, oldest_queued_at=oldest)
