"""Budget routes over real HTTP: who may do what, validation, the answers' shapes, and
a prepaid account with no balance refused new work (402) until credit is added."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuyard.api.rest.schemas import budgets as bs
from gpuyard.testing.fake_runtime import FakeRuntime
from tests.helpers import LiveServer, account_with_members, live_server, make_settings, v1_error
from tests.service.test_budgets import Receiver


def test_permissions(srv: LiveServer) -> None:
    acct, _, keys = account_with_members(srv, "bob@example.com", ("billing", "member"))
    op, owner = srv.client(), srv.client(keys["owner"])
    billing, member = srv.client(keys["billing"]), srv.client(keys["member"])
    base = f"/v1/accounts/{acct}"

    r = op.post(f"{base}/credits", json={"amount": 12.5, "note": "welcome"})
    assert r.status_code == 201, r.text
    added = bs.CreditAddedEnvelope.model_validate(r.json()).data
    assert added.credit.amount_micro == 12_500_000 and added.balance_micro == 12_500_000
    v1_error(owner.post(f"{base}/credits", json={"amount": 1}), 403, "FORBIDDEN")
    v1_error(billing.post(f"{base}/credits", json={"amount": 1}), 403, "FORBIDDEN")

    r = billing.patch(f"{base}/budget", json={"monthly_budget": 100, "alert_percent": 90})
    assert r.status_code == 200, r.text
    budget = bs.BudgetEnvelope.model_validate(r.json()).data
    assert budget.monthly_budget == 100 and budget.alert_percent == 90
    assert budget.billing_mode == "postpaid" and budget.webhook_secret is None
    v1_error(member.patch(f"{base}/budget", json={"alert_percent": 50}), 403, "FORBIDDEN")
    v1_error(member.get(f"{base}/budget"), 403, "FORBIDDEN")
    v1_error(owner.patch(f"{base}/budget", json={"billing_mode": "prepaid"}), 403, "FORBIDDEN")
    r = owner.get(f"{base}/budget")
    assert r.status_code == 200 and r.json()["data"]["monthly_budget"] == 100

    # Another account's routes are 404, never revealing it exists.
    for path in ("budget", "credits", "events", "webhook-deliveries"):
        v1_error(owner.get(f"/v1/accounts/1/{path}"), 404)
        v1_error(owner.get(f"/v1/accounts/999999/{path}"), 404)

    r = op.patch(f"{base}/budget", json={"billing_mode": "prepaid"})
    assert r.status_code == 200, r.text
    budget = bs.BudgetEnvelope.model_validate(r.json()).data
    assert budget.billing_mode == "prepaid" and budget.balance_micro == 12_500_000

    r = billing.get(f"{base}/credits")
    assert r.status_code == 200, r.text
    ledger = bs.CreditLedgerEnvelope.model_validate(r.json()).data
    assert [c.note for c in ledger.credits] == ["welcome"] and ledger.balance_micro == 12_500_000
    r = billing.get(f"{base}/events")
    assert r.status_code == 200 and bs.AccountEventListEnvelope.model_validate(r.json())
    r = billing.get(f"{base}/webhook-deliveries")
    assert r.status_code == 200 and bs.WebhookDeliveryListEnvelope.model_validate(r.json())
    v1_error(member.get(f"{base}/webhook-deliveries"), 403)
    audit = op.get("/v1/audit-events", headers={"X-Gpuyard-Account": str(acct)})
    if audit.status_code == 200:
        actions = {e["action"] for e in audit.json()["data"]["events"]}
        assert {"credit.add", "budget.update"} <= actions


@pytest.mark.parametrize(
    "body",
    [
        {"amount": 0},
        {"amount": 0.0000001},
        {"amount": "5"},
        {"amount": 1e30},
        {"amount": True},
        {"amount": 1, "note": "x" * 501},
        {"amount": 1, "extra": 1},
        {},
    ],
)
def test_credit_validation(srv: LiveServer, body: dict[str, Any]) -> None:
    v1_error(srv.client().post("/v1/accounts/1/credits", json=body), 400, "VALIDATION_ERROR")


@pytest.mark.parametrize(
    "body",
    [
        {"alert_percent": 0},
        {"alert_percent": 101},
        {"alert_percent": None},
        {"monthly_budget": 0},
        {"monthly_budget": -3},
        {"low_balance_hours": -1},
        {"billing_mode": "free"},
        {"webhook_url": "ftp://example.com/x"},
        {"webhook_url": "not a url"},
        {"webhook_url": "http://127.0.0.1:9/hook"},
        {"webhook_url": "http://localhost/hook"},
        {"webhook_url": "http://169.254.169.254/latest/meta-data"},
        {"webhook_url": "http://[::1]/hook"},
    ],
)
def test_budget_validation(srv: LiveServer, body: dict[str, Any]) -> None:
    v1_error(srv.client().patch("/v1/accounts/1/budget", json=body), 400, "VALIDATION_ERROR")


@pytest.fixture
def open_srv(tmp_path: Path) -> Iterator[LiveServer]:
    """A server whose operator allows webhooks to private addresses."""
    settings = make_settings(tmp_path / "home", webhook_allow_private=True)
    with live_server(settings, FakeRuntime()) as server:
        yield server


def test_webhook_secret_is_answered_once_and_prepaid_without_balance_is_402(
    open_srv: LiveServer,
) -> None:
    srv = open_srv
    acct, _, keys = account_with_members(srv, "carol@example.com", ("billing", "member"))
    op, owner = srv.client(), srv.client(keys["owner"])
    base = f"/v1/accounts/{acct}"
    receiver = Receiver()
    try:
        r = owner.patch(f"{base}/budget", json={"webhook_url": receiver.url})
        assert r.status_code == 200, r.text
        secret = r.json()["data"]["webhook_secret"]
        assert secret.startswith("whsec_")
        assert "webhook_secret" not in owner.get(f"{base}/budget").json()["data"]

        # Prepaid with nothing on it: the watch marks it spent; creates answer 402.
        assert op.patch(f"{base}/budget", json={"billing_mode": "prepaid"}).status_code == 200
        cluster = {"gpu_type": "NVIDIA RTX A6000", "docker_image": "img", "volume_gb": 10}
        deadline = time.monotonic() + 10
        while True:
            r = owner.post("/v1/clusters", json=cluster)
            if r.status_code == 402 or time.monotonic() > deadline:
                break
            assert r.status_code == 201, r.text
            owner.delete(f"/v1/clusters/{r.json()['data']['id']}")
            time.sleep(0.2)
        v1_error(r, 402, "BUDGET_EXHAUSTED")
        assert owner.get(f"{base}/budget").json()["data"]["exhausted"] is True
        kinds = [e["kind"] for e in owner.get(f"{base}/events").json()["data"]["events"]]
        assert kinds == ["balance.exhausted"]
        # The webhook is sent by the reconciler, signed.
        deadline = time.monotonic() + 10
        while not receiver.received and time.monotonic() < deadline:
            time.sleep(0.05)
        assert receiver.received, "no webhook delivered"
        deliveries = owner.get(f"{base}/webhook-deliveries").json()["data"]["deliveries"]
        assert deliveries and deliveries[0]["status"] in ("pending", "delivered")

        r = op.post(f"{base}/credits", json={"amount": 50})
        assert r.status_code == 201, r.text
        assert owner.get(f"{base}/budget").json()["data"]["exhausted"] is False
        r = owner.post("/v1/clusters", json=cluster)
        assert r.status_code == 201, r.text
    finally:
        receiver.close()


def test_cli_credits_and_budget(srv: LiveServer) -> None:
    from click.testing import CliRunner

    from gpuyard.cli.main import cli

    acct, _, _ = account_with_members(srv, "dave@example.com", ("billing", "member"))
    env = {
        "GPUYARD_URL": srv.url,
        "GPUYARD_API_KEY": srv.key,
        "GPUYARD_HOME": str(srv.server.ctx.settings.home),
    }

    def run(*args: str) -> str:
        result = CliRunner().invoke(cli, list(args), env=env)
        assert result.exit_code == 0, result.output
        return result.output

    assert "balance: 2.500000 USD" in run("credits", "add", str(acct), "2.5", "--note", "hi")
    out = run("credits", "list", str(acct))
    assert "hi" in out and "credit" in out
    out = run("budget", "set", str(acct), "--monthly-budget", "40", "--alert-percent", "75")
    assert "40.000000" in out and "75%" in out
    assert "postpaid" in run("budget", "show", str(acct))
    data = run("budget", "set", str(acct), "--monthly-budget", "none", "--json")
    assert '"monthly_budget": null' in data
    bad = CliRunner().invoke(cli, ["credits", "add", str(acct), "0"], env=env)
    assert bad.exit_code != 0 and "VALIDATION_ERROR" in bad.output
