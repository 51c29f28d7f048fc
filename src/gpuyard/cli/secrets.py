"""``gpuyard secrets ...``: the account's named secrets (``/v1/secrets``), which a
cluster's env refers to as ``{{ RUNPOD_SECRET_name }}``. A value is read from stdin
(or a file), never from the command line, where other users of the machine could see
it; no command prints a value (the server never answers one)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from gpuyard.cli.common import api_options, make_call
from gpuyard.cli.output import print_json, print_table


def _read_value(path: Path | None) -> str:
    """The value from ``path``, else stdin (prompted, hidden, on a terminal); one
    trailing newline dropped."""
    if path is not None:
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as e:
            raise click.UsageError(f"cannot read {path}: {e}") from e
    elif sys.stdin.isatty():
        text = click.prompt("value", hide_input=True)
    else:
        text = sys.stdin.read()
    return text[:-1] if text.endswith("\n") else text


_VALUE_FILE = click.option(
    "--value-file",
    "path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Read the value from this file (default: stdin).",
)


@click.group("secrets")
def secrets() -> None:
    """Account secrets: use one in a cluster's env as {{ RUNPOD_SECRET_<name> }}."""


@secrets.command("list")
@api_options
def secrets_list(url: str | None, api_key: str | None, as_json: bool) -> None:
    """List the account's secrets (names and descriptions, never values)."""
    call = make_call(url, api_key, as_json)
    with call.client as client:
        data = client.request("GET", "/v1/secrets")
    if call.as_json:
        print_json(data)
        return
    rows = [[s["id"], s["name"], s["reference"], s["updated_at"]] for s in data["secrets"]]
    print_table(["ID", "NAME", "REFERENCE", "UPDATED"], rows, "no secrets")


@secrets.command("create")
@click.argument("name")
@_VALUE_FILE
@click.option("--description", default="", help="What the secret is for.")
@api_options
def secrets_create(
    name: str,
    path: Path | None,
    description: str,
    url: str | None,
    api_key: str | None,
    as_json: bool,
) -> None:
    """Store secret NAME, its value read from stdin or --value-file."""
    value = _read_value(path)
    call = make_call(url, api_key, as_json)
    with call.client as client:
        body = {"name": name, "value": value, "description": description}
        data = client.request("POST", "/v1/secrets", json=body)
    if call.as_json:
        print_json(data)
    else:
        click.echo(f"secret {data['id']} ({data['name']}): use it as {data['reference']}")


@secrets.command("update")
@click.argument("secret_id", metavar="ID", type=int)
@_VALUE_FILE
@click.option("--description", default=None, help="A new description (value unchanged).")
@api_options
def secrets_update(
    secret_id: int,
    path: Path | None,
    description: str | None,
    url: str | None,
    api_key: str | None,
    as_json: bool,
) -> None:
    """Give secret ID a new value (stdin or --value-file), or only a --description."""
    body: dict[str, str] = {}
    if description is not None:
        body["description"] = description
    if path is not None or description is None:
        body["value"] = _read_value(path)
    call = make_call(url, api_key, as_json)
    with call.client as client:
        data = client.request("PATCH", f"/v1/secrets/{secret_id}", json=body)
    if call.as_json:
        print_json(data)
    else:
        click.echo(
            f"secret {data['id']} ({data['name']}) updated: clusters get it at their next start"
        )


@secrets.command("delete")
@click.argument("secret_id", metavar="ID", type=int)
@api_options
def secrets_delete(secret_id: int, url: str | None, api_key: str | None, as_json: bool) -> None:
    """Delete secret ID (clusters that still refer to it cannot start)."""
    call = make_call(url, api_key, as_json)
    with call.client as client:
        data = client.request("DELETE", f"/v1/secrets/{secret_id}")
    if call.as_json:
        print_json(data)
    else:
        click.echo(f"secret {secret_id} deleted")
