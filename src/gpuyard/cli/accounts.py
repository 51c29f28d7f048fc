"""``gpuyard accounts ...`` and ``gpuyard invitations accept``: accounts (the
operator's create, suspend, resume; anybody's list and get) and invitations, over
HTTP like the other commands."""

from __future__ import annotations

from typing import Any

import click

from gpuyard.cli.client import JSON, GpuyardClient
from gpuyard.cli.common import api_options, make_call
from gpuyard.cli.output import key_values, print_json, print_table

ROLES = ("owner", "admin", "member", "billing", "viewer")


class AccountsClient:
    """The account and invitation endpoints, on a :class:`GpuyardClient`."""

    def __init__(self, client: GpuyardClient) -> None:
        self.client = client

    def _call(self, method: str, path: str, json: JSON | None = None, **params: Any) -> JSON:
        return self.client.request(
            method, path, json=json, params={k: v for k, v in params.items() if v is not None}
        )

    def create(self, name: str, owner_email: str, owner_name: str | None) -> JSON:
        body: JSON = {"name": name, "owner_email": owner_email}
        if owner_name:
            body["owner_name"] = owner_name
        return self._call("POST", "/v1/accounts", body)

    def list(self, page: int, per_page: int) -> JSON:
        return self._call("GET", "/v1/accounts", page=page, per_page=per_page)

    def get(self, account_id: int) -> JSON:
        return self._call("GET", f"/v1/accounts/{account_id}")

    def update(self, account_id: int, body: JSON) -> JSON:
        return self._call("PATCH", f"/v1/accounts/{account_id}", body)

    def invite(self, account_id: int, email: str, role: str) -> JSON:
        return self._call(
            "POST", f"/v1/accounts/{account_id}/invitations", {"email": email, "role": role}
        )

    def accept(self, token: str, name: str | None) -> JSON:
        return self._call("POST", f"/v1/invitations/{token}/accept", {"name": name} if name else {})


def _account_row(a: JSON) -> list[Any]:
    return [a["id"], a["name"], a["status"], a.get("status_reason") or "", a["member_count"]]


def _show_account(a: JSON) -> None:
    click.echo(
        key_values(
            [
                ("id", a["id"]),
                ("name", a["name"]),
                ("status", a["status"]),
                ("reason", a.get("status_reason")),
                ("billing", a["billing_mode"]),
                ("members", a["member_count"]),
                ("created", a["created_at"]),
            ]
        )
    )


@click.group("accounts")
def accounts() -> None:
    """Accounts (teams): create, suspend and resume them (operator), list, invite."""


@accounts.command("create")
@click.argument("name")
@click.option("--owner-email", required=True, help="The owner's e-mail (a new or existing user).")
@click.option("--owner-name", default=None, help="The owner's name, for a new user.")
@api_options
def create(
    name: str,
    owner_email: str,
    owner_name: str | None,
    url: str | None,
    api_key: str | None,
    as_json: bool,
) -> None:
    """Create an account with its owner (operator only). The owner's first API key is
    printed once, as the last line."""
    call = make_call(url, api_key, as_json)
    with call.client as client:
        data = AccountsClient(client).create(name, owner_email, owner_name)
    if call.as_json:
        print_json(data)
        return
    _show_account(data["account"])
    key = data["api_key"]
    click.echo(
        f"owner {data['owner']['email']} (user {data['owner']['user_id']}); their key "
        f"{key['id']} ({key['prefix']}..., scope {key['scope']}) is shown only once:"
    )
    click.echo(key["key"])


@accounts.command("list")
@click.option("--page", type=int, default=1, show_default=True, help="Page number.")
@click.option("--per-page", type=int, default=50, show_default=True, help="Accounts per page.")
@api_options
def list_(page: int, per_page: int, url: str | None, api_key: str | None, as_json: bool) -> None:
    """Every account (operator), else the accounts you are a member of."""
    call = make_call(url, api_key, as_json)
    with call.client as client:
        data = AccountsClient(client).list(page, per_page)
    if call.as_json:
        print_json(data)
        return
    print_table(
        ["ID", "NAME", "STATUS", "REASON", "MEMBERS"],
        [_account_row(a) for a in data["accounts"]],
        "no accounts",
    )


@accounts.command("get")
@click.argument("account_id", type=int)
@api_options
def get(account_id: int, url: str | None, api_key: str | None, as_json: bool) -> None:
    """One account."""
    call = make_call(url, api_key, as_json)
    with call.client as client:
        data = AccountsClient(client).get(account_id)
    if call.as_json:
        print_json(data)
        return
    _show_account(data)


def _set_status(
    account_id: int, status: str, reason: str | None, url: str | None, api_key: str | None, j: bool
) -> None:
    call = make_call(url, api_key, j)
    body: JSON = {"status": status}
    if reason:
        body["reason"] = reason
    with call.client as client:
        data = AccountsClient(client).update(account_id, body)
    if call.as_json:
        print_json(data)
        return
    _show_account(data)


@accounts.command("suspend")
@click.argument("account_id", type=int)
@click.option("--reason", default=None, help="Why (shown to members and in cluster events).")
@api_options
def suspend(
    account_id: int, reason: str | None, url: str | None, api_key: str | None, as_json: bool
) -> None:
    """Suspend an account (operator): its clusters stop (volumes kept), new work is
    refused until it is resumed."""
    _set_status(account_id, "suspended", reason, url, api_key, as_json)


@accounts.command("resume")
@click.argument("account_id", type=int)
@api_options
def resume(account_id: int, url: str | None, api_key: str | None, as_json: bool) -> None:
    """Resume a suspended account (operator); its members start their clusters again."""
    _set_status(account_id, "active", None, url, api_key, as_json)


@accounts.command("invite")
@click.argument("account_id", type=int)
@click.argument("email")
@click.option(
    "--role",
    type=click.Choice(ROLES),
    default="member",
    show_default=True,
    help="Role the invited user gets.",
)
@api_options
def invite(
    account_id: int, email: str, role: str, url: str | None, api_key: str | None, as_json: bool
) -> None:
    """Invite EMAIL to the account as ROLE. The token (valid 7 days) is printed once,
    as the last line: `gpuyard invitations accept TOKEN`."""
    call = make_call(url, api_key, as_json)
    with call.client as client:
        data = AccountsClient(client).invite(account_id, email, role)
    if call.as_json:
        print_json(data)
        return
    inv = data["invitation"]
    click.echo(
        f"invited {inv['email']} as {inv['role']} to account {inv['account_id']} "
        f"(invitation {inv['id']}, expires {inv['expires_at']}); the token is shown only once:"
    )
    click.echo(data["token"])


@click.group("invitations")
def invitations() -> None:
    """Accept an invitation to an account."""


@invitations.command("accept")
@click.argument("token")
@click.option("--name", default=None, help="Your name, if you are new here.")
@api_options
def accept(
    token: str, name: str | None, url: str | None, api_key: str | None, as_json: bool
) -> None:
    """Accept an invitation. A new user gets their first API key, printed once as the
    last line; an existing user accepts with --api-key (one of their own keys, not
    restricted), keeps their keys and selects the account with the X-Gpuyard-Account
    header. No key is sent unless --api-key is given (the credentials file's key may
    be somebody else's)."""
    call = make_call(url, None, as_json)
    call.client.close()
    call.client = GpuyardClient(call.client.url, api_key)
    with call.client as client:
        data = AccountsClient(client).accept(token, name)
    if call.as_json:
        print_json(data)
        return
    m = data["membership"]
    click.echo(
        f"{data['user']['email']} joined account {m['account_id']} as {m['role']} "
        f"(membership {m['id']})"
    )
    key = data.get("api_key")
    if key:
        click.echo(f"your key {key['id']} ({key['prefix']}...) is shown only once:")
        click.echo(key["key"])
