"""The job queue the scaler is given by default (``ports.QueuePort``): the queue's own
use cases in ``services/serverless`` — its figures, giving a lost worker's jobs back,
the sweep (silent workers, timeouts, ttl, expired results) and RunPod's worker
environment, with the installation's settings for retries, result keeping and the
workers' ping interval."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.orm import Session

from gpuyard.core.serverless.scaling import QueueState
from gpuyard.services.context import Context
from gpuyard.services.serverless import queue, sweep, worker_env
from gpuyard.settings import Settings


class ServiceQueue:
    """The queue as ``services/serverless`` serves it, under ``settings``."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings

    def queue_state(self, session: Session, endpoint_id: str, now: datetime) -> QueueState:
        """Runs inside the caller's session."""
        return queue.queue_state(session, endpoint_id, now)

    def give_back_jobs(
        self, session: Session, worker_id: str, reason: str, now: datetime, max_retries: int = 3
    ) -> int:
        """Runs inside the caller's transaction; the installation's retry limit and
        result keeping win over ``max_retries``."""
        del max_retries
        return queue.give_back_jobs(
            session,
            worker_id,
            reason,
            now,
            max_retries=self._settings.serverless_job_max_retries,
            keep_s=self._settings.serverless_result_ttl_s,
        )

    def sweep(self, ctx: Context, now: datetime) -> sweep.SweepResult:
        return sweep.sweep(ctx, now)

    def worker_environment(
        self, base_url: str, endpoint_id: str, worker_id: str, key: str
    ) -> dict[str, str]:
        return worker_env.worker_environment(base_url, endpoint_id, worker_id, key)
