"""A plain implementation of what the scaler asks of the job queue
(``scaler.QueuePort``), reading and writing the queue's tables directly: the queue's
state, giving a lost worker's jobs back, RunPod's worker environment. Its ``sweep``
does nothing: ping loss, timeouts and expiry belong to the queue's own sweep, which
replaces this where the queue is served.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from gpuyard.core.serverless.jobs import JobStatus
from gpuyard.core.serverless.scaling import QueueState
from gpuyard.services.context import Context
from gpuyard.store.schema import ServerlessJob, ServerlessWorker


class TableQueue:
    """The queue as its tables hold it."""

    def queue_state(self, session: Session, endpoint_id: str, now: datetime) -> QueueState:
        """How many jobs wait and run, and since when the oldest waits. Runs inside the
        caller's session."""
        del now
        counts = session.execute(
            select(ServerlessJob.status, func.count())
            .where(
                ServerlessJob.endpoint_id == endpoint_id,
                ServerlessJob.status.in_([JobStatus.IN_QUEUE, JobStatus.IN_PROGRESS]),
            )
            .group_by(ServerlessJob.status)
        )
        rows = {status: int(n) for status, n in counts}
        oldest = session.scalar(
            select(func.min(ServerlessJob.queued_at)).where(
                ServerlessJob.endpoint_id == endpoint_id,
                ServerlessJob.status == JobStatus.IN_QUEUE,
            )
        )
        return QueueState(
            in_queue=int(rows.get(JobStatus.IN_QUEUE, 0)),
            in_progress=int(rows.get(JobStatus.IN_PROGRESS, 0)),
            oldest_queued_at=oldest,
        )

    def give_back_jobs(
        self, session: Session, worker_id: str, reason: str, now: datetime, max_retries: int = 3
    ) -> int:
        """The worker's IN_PROGRESS jobs back to the queue (``retried`` counts each), or
        FAILED with ``reason`` once retried ``max_retries`` times. Returns how many it
        held. Runs inside the caller's transaction."""
        jobs = list(
            session.scalars(
                select(ServerlessJob).where(
                    ServerlessJob.worker_id == worker_id,
                    ServerlessJob.status == JobStatus.IN_PROGRESS,
                )
            )
        )
        for job in jobs:
            job.worker_id = None
            job.updated_at = now
            if job.retried >= max_retries:
                job.status = JobStatus.FAILED
                job.error = f"{reason} (given back {job.retried} times)"
                job.completed_at = now
            else:
                job.status = JobStatus.IN_QUEUE
                job.retried += 1
                job.queued_at = now
                job.started_at = None
        session.execute(
            update(ServerlessWorker)
            .where(ServerlessWorker.id == worker_id)
            .values(jobs_in_progress=0, updated_at=now)
        )
        return len(jobs)

    def sweep(self, ctx: Context, now: datetime) -> None:
        """Nothing here (the queue's own sweep finds lost pings and timeouts)."""
        del ctx, now

    def worker_environment(
        self, base_url: str, endpoint_id: str, worker_id: str, key: str
    ) -> dict[str, str]:
        """RunPod's worker environment pointing at ``base_url``."""
        jobs = f"{base_url}/runpod/v2/{endpoint_id}"
        return {
            "RUNPOD_POD_ID": worker_id,
            "RUNPOD_ENDPOINT_ID": endpoint_id,
            "RUNPOD_AI_API_KEY": key,
            "RUNPOD_WEBHOOK_GET_JOB": f"{jobs}/job-take/$RUNPOD_POD_ID",
            "RUNPOD_WEBHOOK_POST_OUTPUT": f"{jobs}/job-done/$RUNPOD_POD_ID/$ID",
            "RUNPOD_WEBHOOK_POST_STREAM": f"{jobs}/job-stream/$RUNPOD_POD_ID/$ID",
            "RUNPOD_WEBHOOK_PING": f"{jobs}/ping/$RUNPOD_POD_ID",
        }
