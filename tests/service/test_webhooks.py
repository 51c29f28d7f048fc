"""Webhook deliveries: redirects are not followed, the target is checked again at send
time, and a removed webhook ends its pending deliveries."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from sqlalchemy import select

from gpuyard.services.billing import budgets
from gpuyard.services.billing.budgets import BudgetChange
from gpuyard.services.clock import FakeClock
from gpuyard.services.context import Context
from gpuyard.services.tenancy import webhooks
from gpuyard.services.tenancy.auth import Principal
from gpuyard.store.schema import Account, WebhookDelivery


class Redirector:
    """Answers every POST with a redirect to ``/elsewhere`` and counts the hits there."""

    def __init__(self) -> None:
        self.hits: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                outer.hits.append(self.path)
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                self.send_response(307)
                self.send_header("Location", "/elsewhere")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def redirector() -> Iterator[Redirector]:
    r = Redirector()
    yield r
    r.close()


def _event(ctx: Context, p: Principal, clock: FakeClock, dedupe: str) -> None:
    with ctx.transaction() as session:
        account = session.get(Account, p.account_id)
        assert account is not None
        budgets.record_account_event(
            session, account, "budget.alert", "test", clock.now(), dedupe=dedupe
        )


def _delivery(ctx: Context) -> WebhookDelivery:
    with ctx.read() as session:
        return session.scalars(select(WebhookDelivery).order_by(WebhookDelivery.id.desc())).first()  # type: ignore[return-value]


def _set(ctx: Context, p: Principal, url: str | None) -> None:
    budgets.update_budget(
        ctx, p, p.account_id, BudgetChange(fields=frozenset({"webhook_url"}), webhook_url=url)
    )


def test_redirects_are_not_followed(
    ctx: Context,
    alice: Principal,
    clock: FakeClock,
    redirector: Redirector,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ctx.settings, "webhook_allow_private", True)
    _set(ctx, alice, redirector.url)
    _event(ctx, alice, clock, "r1")
    assert webhooks.deliver_due(ctx) == 0
    d = _delivery(ctx)
    assert d.status == "pending" and "redirects are not followed" in (d.last_error or "")
    assert redirector.hits == ["/hook"]


def test_target_is_checked_again_at_send_time(
    ctx: Context,
    alice: Principal,
    clock: FakeClock,
    redirector: Redirector,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ctx.settings, "webhook_allow_private", True)
    _set(ctx, alice, redirector.url)
    _event(ctx, alice, clock, "t1")
    # The operator closes private targets (or the name now resolves elsewhere).
    monkeypatch.setattr(ctx.settings, "webhook_allow_private", False)
    webhooks.deliver_due(ctx)
    d = _delivery(ctx)
    assert "target refused" in (d.last_error or "") and redirector.hits == []


def test_unset_webhook_fails_pending_deliveries_and_private_url_refused(
    ctx: Context, alice: Principal, clock: FakeClock, redirector: Redirector
) -> None:
    from gpuyard.core.errors import ValidationFailed

    with pytest.raises(ValidationFailed):
        _set(ctx, alice, redirector.url)  # 127.0.0.1 with the setting off
    ctx.settings.webhook_allow_private = True
    try:
        _set(ctx, alice, redirector.url)
    finally:
        ctx.settings.webhook_allow_private = False
    _event(ctx, alice, clock, "u1")
    _set(ctx, alice, None)
    webhooks.deliver_due(ctx)
    d = _delivery(ctx)
    assert d.status == "failed" and "removed" in (d.last_error or "")
    with ctx.read() as session:
        account = session.get(Account, alice.account_id)
        assert account is not None and account.webhook_secret is None
