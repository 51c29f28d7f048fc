"""Budgets on a real store with the injected clock: a prepaid balance spent stops its
clusters at the crossing (volumes kept), the webhook is delivered (and retried), a
top-up opens the account again, and the debits equal the bill; postpaid alerts fire
once per month."""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from sqlalchemy import select

from gpuyard.core.errors import BudgetExhausted
from gpuyard.reconciler.duties.budgets import BudgetWatch
from gpuyard.reconciler.loop import Reconciler
from gpuyard.services.billing import budgets, metering
from gpuyard.services.billing.budgets import BudgetChange
from gpuyard.services.clock import FakeClock
from gpuyard.services.clusters import use_cases as uc
from gpuyard.services.clusters.requests import CreateCluster, StartCluster
from gpuyard.services.context import Context
from gpuyard.services.tenancy import webhooks
from gpuyard.services.tenancy.auth import Principal
from gpuyard.store.schema import Account, AccountEvent, AuditEvent, WebhookDelivery
from gpuyard.testing.fake_runtime import FakeRuntime

A = "NVIDIA RTX A6000"


class Receiver:
    """A local webhook receiver: records each POST; answers ``fail_first`` 500s."""

    def __init__(self, fail_first: int = 0) -> None:
        self.fail_first = fail_first
        self.received: list[tuple[dict[str, str], bytes]] = []
        self.answered: list[int] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                outer.received.append(({k.lower(): v for k, v in self.headers.items()}, body))
                status = 500 if len(outer.received) <= outer.fail_first else 204
                outer.answered.append(status)
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver(fail_first=1)
    yield r
    r.close()


@pytest.fixture
def allow_private(ctx: Context, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ctx.settings, "webhook_allow_private", True)


def operator_of(p: Principal) -> Principal:
    return dataclasses.replace(p, operator=True)


def body() -> CreateCluster:
    return CreateCluster.model_validate({"gpu_type": A, "docker_image": "img", "volume_gb": 50})


def settle(rec: Reconciler, cid: str) -> None:
    for _ in range(3):
        rec.driver.drive(cid)


def change(**kw: Any) -> BudgetChange:
    return BudgetChange(fields=frozenset(kw), **kw)


def account_of(ctx: Context, p: Principal) -> Account:
    with ctx.read() as session:
        account = session.get(Account, p.account_id)
        assert account is not None
        return account


def events(ctx: Context, p: Principal) -> list[str]:
    return [e.kind for e in reversed(budgets.list_events(ctx, p.account_id))]


def test_prepaid_balance_spent_stops_clusters_and_a_top_up_reopens(
    ctx: Context,
    alice: Principal,
    rec: Reconciler,
    runtime: FakeRuntime,
    clock: FakeClock,
    receiver: Receiver,
    allow_private: None,
) -> None:
    op = operator_of(alice)
    view = budgets.update_budget(
        ctx,
        op,
        alice.account_id,
        change(billing_mode="prepaid", low_balance_hours=0.5, webhook_url=receiver.url),
    )
    secret = view.webhook_secret
    assert secret is not None and secret.startswith("whsec_")
    assert account_of(ctx, alice).webhook_secret != secret  # stored sealed
    cid = uc.create_cluster(ctx, alice, body()).id
    settle(rec, cid)
    with ctx.read() as session:
        rate = budgets.spend_rate_micro(session, alice.account_id)
    assert rate > 0
    # Spend so far is the seconds since creation (none on a fake clock): an hour's worth.
    budgets.add_credit(ctx, op, alice.account_id, rate, "first top-up")
    watch = BudgetWatch(ctx)
    start = clock.now()
    watch.run()
    assert events(ctx, alice) == []
    # The low-balance alert (under 30 min left) is the first deadline: about 30 min.
    wait = watch.seconds_until_next()
    assert wait is not None and 1800 <= wait <= 1801
    clock.advance(wait)
    watch.run()
    assert events(ctx, alice) == ["balance.low"]
    # Delivered at once, the receiver failed it: retried after the back-off.
    assert receiver.answered == [500]
    with ctx.read() as session:
        d = session.scalars(select(WebhookDelivery)).one()
        assert d.status == "pending" and d.attempts == 1 and "HTTP 500" in (d.last_error or "")
    clock.advance(10)
    watch.run()
    assert receiver.answered == [500, 204]
    headers, raw = receiver.received[-1]
    assert headers["x-gpuyard-event"] == "balance.low"
    assert headers["content-type"] == "application/json"
    assert webhooks.verify(secret, raw, headers["x-gpuyard-signature"])
    payload = json.loads(raw)
    assert payload["type"] == "balance.low" and payload["account_id"] == alice.account_id
    assert set(payload) == {"id", "type", "account_id", "message", "detail", "created_at"}
    with ctx.read() as session:
        assert session.scalars(select(WebhookDelivery)).one().status == "delivered"

    # The balance lasts one hour from the start: not a second before.
    wait = watch.seconds_until_next()
    assert wait is not None
    crossing = clock.now() + timedelta(seconds=wait)
    assert crossing - start <= timedelta(hours=1, seconds=1)
    clock.advance(wait - 1)
    watch.run()
    assert uc.get_cluster(ctx, alice, cid).status == "running"
    assert account_of(ctx, alice).exhausted_at is None
    clock.advance(1)
    checks = watch.run()
    assert any(cid in c.stopped for c in checks)
    assert account_of(ctx, alice).exhausted_at is not None
    assert events(ctx, alice) == ["balance.low", "balance.exhausted"]
    settle(rec, cid)
    stopped = uc.get_cluster(ctx, alice, cid)
    assert stopped.status == "stopped"
    assert any("budget exhausted" in e.message for e in uc.list_events(ctx, alice, cid))
    assert any(cid in name for name in runtime.volumes)  # the volume is kept
    # New work is refused with 402 until credit is added.
    with pytest.raises(BudgetExhausted):
        uc.create_cluster(ctx, alice, body())
    with pytest.raises(BudgetExhausted):
        uc.start_cluster(ctx, alice, cid, StartCluster())
    clock.advance(5)
    watch.run()  # nothing fires twice
    assert events(ctx, alice) == ["balance.low", "balance.exhausted"]
    assert receiver.answered[-1] == 204 and len(receiver.answered) == 3

    added = budgets.add_credit(ctx, op, alice.account_id, 10 * rate, "second top-up")
    assert added.lifted and added.balance_micro > 0
    assert account_of(ctx, alice).exhausted_at is None
    uc.start_cluster(ctx, alice, cid, StartCluster())
    settle(rec, cid)
    assert uc.get_cluster(ctx, alice, cid).status == "running"
    clock.advance(7 * 3600 + 17)

    # The ledger's debits are the bill, to the micro-dollar.
    now = clock.now()
    ledger = budgets.ledger(ctx, alice.account_id)
    with ctx.read() as session:
        since = account_of(ctx, alice).prepaid_since
        assert since is not None
        total = metering.bill(
            session, alice.account_id, None, since, now, metering.GroupBy.DAY, now
        ).total_micro
    assert sum(d.amount_micro for d in ledger.debits) == total == ledger.debits_micro
    assert ledger.credits_micro == 11 * rate
    assert ledger.balance_micro == 11 * rate - total
    with ctx.read() as session:
        actions = list(session.scalars(select(AuditEvent.action).order_by(AuditEvent.id)))
    assert actions == ["budget.update", "credit.add", "credit.add"]


def test_the_reconciler_stops_at_the_crossing(
    ctx: Context, alice: Principal, rec: Reconciler, clock: FakeClock
) -> None:
    """The watch runs in the reconciler's pass, under its duty, and sets its sleep."""
    op = operator_of(alice)
    budgets.update_budget(ctx, op, alice.account_id, change(billing_mode="prepaid"))
    cid = uc.create_cluster(ctx, alice, body())
    settle(rec, cid.id)
    with ctx.read() as session:
        rate = budgets.spend_rate_micro(session, alice.account_id)
    budgets.add_credit(ctx, op, alice.account_id, rate // 60, "a minute")
    rec.run_pass(observe=False)
    wait = rec.budget.seconds_until_next()
    assert wait is not None and 59 <= wait <= 61
    clock.advance(wait)
    rec.run_pass(observe=False)
    assert uc.get_cluster(ctx, alice, cid.id).status in ("stopping", "stopped")
    assert rec.wait_idle(10)
    assert uc.get_cluster(ctx, alice, cid.id).status == "stopped"


def test_postpaid_alert_once_per_month_and_budget_raise_reopens(
    ctx: Context, alice: Principal, rec: Reconciler, clock: FakeClock
) -> None:
    cid = uc.create_cluster(ctx, alice, body()).id
    settle(rec, cid)
    with ctx.read() as session:
        rate = budgets.spend_rate_micro(session, alice.account_id)
    # A budget of 10 hours at this rate: the alert at 8 h, the stop at 10 h.
    budgets.update_budget(ctx, alice, alice.account_id, change(monthly_budget_micro=10 * rate))
    watch = BudgetWatch(ctx)
    watch.run()
    wait = watch.seconds_until_next()
    assert wait is not None and 8 * 3600 - 1 <= wait <= 8 * 3600 + 1
    clock.advance(wait)
    watch.run()
    assert events(ctx, alice) == ["budget.alert"]
    clock.advance(600)
    watch.forget()  # a full re-check records nothing new
    watch.run()
    assert events(ctx, alice) == ["budget.alert"]
    view = budgets.budget_view(ctx, alice.account_id)
    assert view.alert and view.exhausts_at is not None and view.balance_micro is None
    clock.advance((view.exhausts_at - clock.now()).total_seconds())
    watch.run()
    assert events(ctx, alice) == ["budget.alert", "budget.exhausted"]
    settle(rec, cid)
    assert uc.get_cluster(ctx, alice, cid).status == "stopped"
    with pytest.raises(BudgetExhausted):
        uc.start_cluster(ctx, alice, cid, StartCluster())
    # A raised budget lifts the mark in the same change.
    view = budgets.update_budget(
        ctx, alice, alice.account_id, change(monthly_budget_micro=20 * rate)
    )
    assert view.account.exhausted_at is None and not view.standing.exhausted
    uc.start_cluster(ctx, alice, cid, StartCluster())
    with ctx.read() as session:
        kinds = list(session.scalars(select(AccountEvent.kind).order_by(AccountEvent.id)))
    assert kinds == ["budget.alert", "budget.exhausted", "spending.resumed"]


def test_a_new_month_reopens_a_spent_postpaid_account(
    ctx: Context, alice: Principal, rec: Reconciler, clock: FakeClock
) -> None:
    cid = uc.create_cluster(ctx, alice, body()).id
    settle(rec, cid)
    with ctx.read() as session:
        rate = budgets.spend_rate_micro(session, alice.account_id)
    budgets.update_budget(ctx, alice, alice.account_id, change(monthly_budget_micro=rate))
    watch = BudgetWatch(ctx)
    watch.run()
    clock.advance(3600)
    watch.run()
    assert account_of(ctx, alice).exhausted_at is not None
    settle(rec, cid)
    wait = watch.seconds_until_next()
    assert wait is not None  # the next month's start
    clock.advance(wait)
    watch.run()
    assert account_of(ctx, alice).exhausted_at is None
    uc.start_cluster(ctx, alice, cid, StartCluster())


def test_a_delivery_gives_up_after_the_last_attempt(
    ctx: Context,
    alice: Principal,
    clock: FakeClock,
    allow_private: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ctx.settings, "webhook_max_attempts", 2)
    r = Receiver(fail_first=10)
    try:
        budgets.update_budget(ctx, alice, alice.account_id, change(webhook_url=r.url))
        with ctx.transaction() as session:
            account = session.get(Account, alice.account_id)
            assert account is not None
            budgets.record_account_event(
                session, account, "budget.alert", "test", clock.now(), dedupe="x"
            )
        assert webhooks.deliver_due(ctx) == 0
        clock.advance(10)
        assert webhooks.deliver_due(ctx) == 0
        with ctx.read() as session:
            d = session.scalars(select(WebhookDelivery)).one()
        assert d.status == "failed" and d.attempts == 2 and r.answered == [500, 500]
    finally:
        r.close()
