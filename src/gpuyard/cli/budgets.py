"""``gpuyard credits`` and ``gpuyard budget``: an account's prepaid ledger and budget.

- ``gpuyard credits add ACCOUNT_ID AMOUNT [--note]`` (the operator): a top-up, or a
  correction with a negative amount.
- ``gpuyard credits list ACCOUNT_ID``: credit lines, daily debits and the balance.
- ``gpuyard budget show ACCOUNT_ID`` / ``gpuyard budget set ACCOUNT_ID ...``.
"""

from __future__ import annotations

from typing import Any

import click

from gpuyard.cli.client import GpuyardClient
from gpuyard.cli.common import api_options, make_call
from gpuyard.cli.output import key_values, print_json, print_table


def _call(client: GpuyardClient, method: str, path: str, body: Any = None) -> dict[str, Any]:
    # Errors come back as ApiError, which the CLI's boundary shows.
    return client.request(method, path, json=body)


def _usd(value: float | None) -> str:
    return "-" if value is None else f"{value:.6f}"


@click.group("credits")
def credits() -> None:
    """An account's prepaid ledger: credit lines and daily debits."""


@credits.command("add")
@click.argument("account_id", type=click.IntRange(min=1))
@click.argument("amount", type=str)
@click.option("--note", default="", help="Why (shown in the ledger).")
@api_options
def credits_add(
    account_id: int,
    amount: str,
    note: str,
    url: str | None,
    api_key: str | None,
    as_json: bool,
) -> None:
    """Add AMOUNT USD (negative: a correction) to ACCOUNT_ID's balance. Operator only."""
    try:
        value: float | int = int(amount) if amount.lstrip("-").isdigit() else float(amount)
    except ValueError:
        raise click.BadParameter(
            f"{amount!r} is not a number of USD", param_hint="AMOUNT"
        ) from None
    call = make_call(url, api_key, as_json)
    with call.client as client:
        data = _call(
            client,
            "POST",
            f"/v1/accounts/{account_id}/credits",
            {"amount": value, "note": note},
        )
    if call.as_json:
        print_json(data)
        return
    credit = data["credit"]
    click.echo(f"credit {credit['id']}: {_usd(credit['amount'])} USD")
    click.echo(f"balance: {_usd(data['balance'])} USD")


@credits.command("list")
@click.argument("account_id", type=click.IntRange(min=1))
@api_options
def credits_list(account_id: int, url: str | None, api_key: str | None, as_json: bool) -> None:
    """ACCOUNT_ID's credit lines and daily debits, and its balance."""
    call = make_call(url, api_key, as_json)
    with call.client as client:
        data = _call(client, "GET", f"/v1/accounts/{account_id}/credits")
    if call.as_json:
        print_json(data)
        return
    rows = [[c["created_at"], "credit", _usd(c["amount"]), c["note"]] for c in data["credits"]] + [
        [d["day"], "debit", _usd(-d["amount"]), ""] for d in data["debits"]
    ]
    print_table(["WHEN", "KIND", "USD", "NOTE"], sorted(rows, key=lambda r: r[0] or ""), "empty")
    click.echo(
        f"credits {_usd(data['credits_total'])}  debits {_usd(data['debits_total'])}  "
        f"balance {_usd(data['balance'])} USD ({data['billing_mode']}, since {data['since']})"
    )


@click.group("budget")
def budget() -> None:
    """An account's budget, alerts and webhook."""


def _show(data: dict[str, Any]) -> None:
    pairs = [
        ("billing mode", data["billing_mode"]),
        ("monthly budget", _usd(data["monthly_budget"])),
        ("alert at", f"{data['alert_percent']}%"),
        ("low balance warning", f"{data['low_balance_hours']} h"),
        ("webhook", data["webhook_url"] or "-"),
        ("spent this month", _usd(data["spent_this_month"])),
        ("balance", _usd(data["balance"])),
        ("spend rate", f"{_usd(data['spend_rate_per_hour'])} /h"),
        ("runs out at", data["exhausts_at"] or "-"),
        ("exhausted", "yes" if data["exhausted"] else "no"),
        ("alert", "yes" if data["alert"] else "no"),
    ]
    click.echo(key_values(pairs))
    if data.get("webhook_secret"):
        click.echo(f"webhook secret (shown once): {data['webhook_secret']}")


@budget.command("show")
@click.argument("account_id", type=click.IntRange(min=1))
@api_options
def budget_show(account_id: int, url: str | None, api_key: str | None, as_json: bool) -> None:
    """ACCOUNT_ID's budget settings and where it stands."""
    call = make_call(url, api_key, as_json)
    with call.client as client:
        data = _call(client, "GET", f"/v1/accounts/{account_id}/budget")
    if call.as_json:
        print_json(data)
    else:
        _show(data)


@budget.command("set")
@click.argument("account_id", type=click.IntRange(min=1))
@click.option("--monthly-budget", default=None, help="USD per month, or 'none'.")
@click.option(
    "--alert-percent",
    type=click.IntRange(1, 100),
    default=None,
    help="Alert when spend reaches this percent of the budget.",
)
@click.option(
    "--low-balance-hours",
    type=click.FloatRange(min=0),
    default=None,
    help="Warn when the balance lasts fewer hours than this.",
)
@click.option("--webhook-url", default=None, help="A URL, or 'none' to remove the webhook.")
@click.option(
    "--billing-mode",
    type=click.Choice(["postpaid", "prepaid"]),
    default=None,
    help="Pay after use or from a prepaid balance.",
)
@api_options
def budget_set(
    account_id: int,
    monthly_budget: str | None,
    alert_percent: int | None,
    low_balance_hours: float | None,
    webhook_url: str | None,
    billing_mode: str | None,
    url: str | None,
    api_key: str | None,
    as_json: bool,
) -> None:
    """Change ACCOUNT_ID's budget settings (only the options given)."""
    body: dict[str, Any] = {}
    if monthly_budget is not None:
        if monthly_budget.lower() == "none":
            body["monthly_budget"] = None
        else:
            try:
                body["monthly_budget"] = float(monthly_budget)
            except ValueError:
                raise click.BadParameter(
                    f"{monthly_budget!r} is not a number", param_hint="--monthly-budget"
                ) from None
    if alert_percent is not None:
        body["alert_percent"] = alert_percent
    if low_balance_hours is not None:
        body["low_balance_hours"] = low_balance_hours
    if webhook_url is not None:
        body["webhook_url"] = None if webhook_url.lower() == "none" else webhook_url
    if billing_mode is not None:
        body["billing_mode"] = billing_mode
    if not body:
        raise click.UsageError("nothing to change: give at least one option")
    call = make_call(url, api_key, as_json)
    with call.client as client:
        data = _call(client, "PATCH", f"/v1/accounts/{account_id}/budget", body)
    if call.as_json:
        print_json(data)
    else:
        _show(data)
