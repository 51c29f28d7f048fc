"""Webhook deliveries, each attempt a job on the webhook lane (outbound POSTs that may
take their timeout never hold up other work)."""

from __future__ import annotations

from gpuyard.reconciler.lanes import WEBHOOKS, Dispatcher
from gpuyard.services.context import Context
from gpuyard.services.tenancy.webhooks import deliver


class WebhookSender:
    """Queues one attempt of a due delivery (the budget watch's ``dispatch``)."""

    def __init__(self, ctx: Context, dispatcher: Dispatcher) -> None:
        self.ctx = ctx
        self.dispatcher = dispatcher

    def send(self, delivery_id: int) -> None:
        def job() -> None:
            deliver(self.ctx, delivery_id)

        if not self.dispatcher.stopping:
            self.dispatcher.submit(("webhook", delivery_id), WEBHOOKS, job)
