"""What the serverless scaler asks of the job queue, as a protocol:
``queue_port.ServiceQueue`` serves it with the queue's use cases (services/serverless);
tests may give their own."""

from __future__ import annotations

from datetime import datetime
from typing import Protocol

from sqlalchemy.orm import Session

from gpuyard.core.serverless.scaling import QueueState
from gpuyard.services.context import Context


class QueuePort(Protocol):
    def queue_state(self, session: Session, endpoint_id: str, now: datetime) -> QueueState:
        """How many of the endpoint's jobs wait and run, and since when the oldest
        waits. Runs inside the caller's session."""
        ...

    def give_back_jobs(
        self, session: Session, worker_id: str, reason: str, now: datetime, max_retries: int = 3
    ) -> object:
        """A lost worker's IN_PROGRESS jobs back to the queue (or FAILED with ``reason``
        past ``max_retries``). Runs inside the caller's transaction."""
        ...

    def sweep(self, ctx: Context, now: datetime) -> object:
        """Ping loss, execution timeouts, expiry; workers whose container must be
        replaced are set to ``recycle``. Owns its transactions."""
        ...

    def worker_environment(
        self, base_url: str, endpoint_id: str, worker_id: str, key: str
    ) -> dict[str, str]:
        """RunPod's worker environment (RUNPOD_WEBHOOK_* ...) pointing at ``base_url``."""
        ...
