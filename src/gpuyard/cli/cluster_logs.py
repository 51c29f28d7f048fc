"""``gpuyard clusters logs ID [-f] [--tail N] [--since T]``: a cluster's container
output and gpuyard's events for it (``GET /v1/clusters/{id}/logs``).

Without ``-f`` it prints one page; with ``-f`` it reads the Server-Sent Events stream
and keeps printing until the cluster is terminated or Ctrl-C. A dropped connection is
resumed from the last entry (``Last-Event-ID``), so nothing is lost or printed twice.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import click
import httpx

from gpuyard.cli.client import ApiError, GpuyardClient, ServerUnreachable
from gpuyard.cli.common import api_options, make_call
from gpuyard.cli.output import print_json
from gpuyard.core.input_rules import shown_safely

# A follow that loses its connection tries again this often, this many times in a row.
RECONNECT_S = 2.0
RECONNECT_TRIES = 30
# Longer than the server's 15 s heartbeat: silence past this means the link is dead.
READ_TIMEOUT_S = 60.0


def _error(resp: httpx.Response) -> ApiError:
    """The API error an answer carries (the v1 envelope), or a plain HTTP one."""
    try:
        body = resp.json()
    except ValueError:
        body = None
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(err, dict):
        details = err.get("details")
        return ApiError(
            str(err.get("code") or "HTTP_ERROR"),
            str(err.get("message") or resp.reason_phrase),
            details if isinstance(details, dict) else None,
            resp.status_code,
        )
    return ApiError("HTTP_ERROR", f"HTTP {resp.status_code}", None, resp.status_code)


def _line(entry: dict[str, Any], raw: bool) -> str:
    """``<ts> <line>`` for container output, ``<ts> [gpuyard] <line>`` for events.
    Control characters (but tabs) are shown as U+FFFD unless ``raw``."""
    text = str(entry.get("line", ""))
    if not raw:
        text = "\t".join(shown_safely(part) for part in text.split("\t"))
    tag = "[gpuyard] " if entry.get("source") == "system" else ""
    return f"{entry.get('ts', '')} {tag}{text}"


def _events(resp: httpx.Response) -> Iterator[tuple[str | None, str, str]]:
    """(id, event, data) of each event of an SSE answer, as it arrives."""
    fields: dict[str, str] = {}
    data: list[str] = []
    for line in resp.iter_lines():
        if not line:
            if data:
                yield fields.get("id"), fields.get("event", "message"), "\n".join(data)
            fields, data = {}, []
        elif not line.startswith(":"):
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "data":
                data.append(value)
            else:
                fields[name] = value


def _follow(
    client: GpuyardClient, path: str, params: dict[str, str | int], raw: bool, as_json: bool
) -> None:
    last: str | None = None
    failures = 0
    while True:
        headers = {"Last-Event-ID": last} if last else {}
        timeout = httpx.Timeout(30.0, read=READ_TIMEOUT_S)
        try:
            with client.http.stream(
                "GET", path, params=params, headers=headers, timeout=timeout
            ) as resp:
                if resp.status_code == 204:
                    return  # resumed a terminated cluster's finished stream
                if not resp.is_success:
                    resp.read()
                    raise _error(resp)
                failures = 0
                for event_id, kind, data in _events(resp):
                    if kind == "end":
                        return
                    entry = json.loads(data)
                    click.echo(json.dumps(entry) if as_json else _line(entry, raw), color=raw)
                    last = event_id or last
            # The server ended the stream without "end" (it restarted): go on.
        except httpx.TransportError as e:
            if last is None and failures == 0 and isinstance(e, httpx.ConnectError):
                raise ServerUnreachable(client.url, f"connection failed ({e})") from e
            failures += 1
            if failures > RECONNECT_TRIES:
                raise ServerUnreachable(client.url, f"lost the log stream ({e})") from e
            click.echo(f"(connection lost: {type(e).__name__}; reconnecting)", err=True)
        time.sleep(RECONNECT_S if failures else 0.2)


@click.command("logs")
@click.argument("cluster_id")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines as they come.")
@click.option(
    "--tail",
    type=click.IntRange(0, 5000),
    default=100,
    show_default=True,
    help="How many of the last lines to show first.",
)
@click.option("--since", default=None, help="Only lines from then on: RFC 3339, Unix seconds, 10m.")
@click.option("--raw", is_flag=True, help="Print control characters (colours) as they are.")
@api_options
def logs(
    cluster_id: str,
    follow: bool,
    tail: int,
    since: str | None,
    raw: bool,
    url: str | None,
    api_key: str | None,
    as_json: bool,
) -> None:
    """A cluster's output and gpuyard's events for it, oldest first (events marked
    [gpuyard]). A stopped cluster's output stays readable until it is terminated."""
    call = make_call(url, api_key, as_json)
    path = f"/v1/clusters/{cluster_id}/logs"
    params: dict[str, str | int] = {"tail": tail}
    if since is not None:
        params["since"] = since
    with call.client as client:
        if follow:
            _follow(client, path, {**params, "follow": "true"}, raw, call.as_json)
            return
        try:
            resp = client.http.get(path, params=params)
        except httpx.TransportError as e:
            raise ServerUnreachable(client.url, str(e) or type(e).__name__) from e
        if not resp.is_success:
            raise _error(resp)
        entries: list[dict[str, Any]] = resp.json().get("data") or []
    if call.as_json:
        print_json(entries)
        return
    for entry in entries:
        # color=raw: click would strip escape sequences when not on a terminal.
        click.echo(_line(entry, raw), color=raw)
