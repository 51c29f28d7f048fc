"""A job's completion webhook: a delivery row sent, signed and retried exactly as the
account's own webhooks (services/tenancy/webhooks.py), to the URL the job named.

The body is the job's status answer (RunPod's ``{id, status, delayTime, executionTime,
output | error}``), signed with the account's webhook secret (``X-Gpuyard-Signature``);
an account with no webhook set has no secret, and its job deliveries fail saying so.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from gpuyard.services.tenancy.webhooks import JOB_EVENT_ID, PENDING
from gpuyard.store.schema import WebhookDelivery
from gpuyard.store.schema.serverless import ServerlessJob


def enqueue_job_webhook(
    session: Session, job: ServerlessJob, body: dict[str, Any], now: datetime
) -> None:
    """A delivery of ``body`` to the job's webhook, when it named one. Runs inside the
    caller's transaction."""
    if not job.webhook:
        return
    session.add(
        WebhookDelivery(
            account_id=job.account_id,
            event_id=JOB_EVENT_ID,
            url=job.webhook,
            body=json.dumps(body, separators=(",", ":"), sort_keys=True),
            status=PENDING,
            attempts=0,
            next_attempt_at=now,
            created_at=now,
        )
    )
