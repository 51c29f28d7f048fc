"""Glue shared by the HTTP commands: global options, the client factory and the
error boundary that turns client errors into ``error: ...`` (or, under ``--json``, one
JSON error object) on stderr and exit status 1."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import click

from gpuyard.cli.client import ApiError, GpuyardClient, ServerUnreachable
from gpuyard.cli.config import resolve_target
from gpuyard.cli.output import error_json, format_api_error
from gpuyard.core.errors import GpuyardError

F = TypeVar("F", bound=Callable[..., Any])


@dataclass
class CliState:
    """Options given to the root group, before the sub-command."""

    url: str | None = None
    api_key: str | None = None
    json: bool = False


def state(ctx: click.Context) -> CliState:
    root = ctx.find_root()
    if not isinstance(root.obj, CliState):
        root.obj = CliState()
    return root.obj


def remember_json(ctx: click.Context, _param: click.Parameter, value: bool) -> bool:
    """Callback of every ``--json`` flag: records it on the root state, so the error
    boundary answers a failure of that command as JSON too."""
    if value:
        state(ctx).json = True
    return value


def api_options(f: F) -> F:
    """Add ``--url``, ``--api-key`` and ``--json`` to an HTTP command; each may also be
    given to the root group (``gpuyard --json clusters list``)."""
    f = click.option(
        "--json",
        "as_json",
        is_flag=True,
        default=False,
        callback=remember_json,
        help="Print the raw JSON data (errors too: a JSON object on stderr).",
    )(f)
    f = click.option(
        "--api-key", "api_key", default=None, help="API key (else $GPUYARD_API_KEY, credentials)."
    )(f)
    f = click.option("--url", default=None, help="Server URL (else $GPUYARD_URL, credentials).")(f)
    return f


@dataclass
class Call:
    """What an HTTP command needs: a client and whether to print JSON."""

    client: GpuyardClient
    as_json: bool


def make_call(url: str | None, api_key: str | None, as_json: bool) -> Call:
    """Resolve the server from the command's flags, the root group's flags, the
    environment and the credentials file (in that order)."""
    s = state(click.get_current_context())
    target = resolve_target(url or s.url, api_key or s.api_key)
    return Call(GpuyardClient(target.url, target.api_key), as_json or s.json)


class ErrorBoundaryGroup(click.Group):
    """A group whose sub-commands' expected failures end as one ``error:`` message on
    stderr and exit status 1, never as a traceback. Under ``--json`` (the root's or the
    command's) the message is instead one JSON object on stderr,
    ``{"error": {"code", "message", "status", "details"}}``."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (ApiError, ServerUnreachable, GpuyardError) as e:
            if state(ctx).json:
                click.echo(error_json(e), err=True)
            else:
                click.echo(_in_words(e), err=True)
            ctx.exit(1)


def _in_words(e: ApiError | ServerUnreachable | GpuyardError) -> str:
    """Today's human message for an expected failure (with a hint where one helps)."""
    if isinstance(e, ApiError):
        text = format_api_error(e)
        if e.status == 401:
            text += (
                "\n  hint: pass --api-key, set GPUYARD_API_KEY, or create a key with "
                "`gpuyard keys create`"
            )
        return text
    if isinstance(e, ServerUnreachable):
        return (
            f"error: the gpuyard server is not reachable at {e.url} ({e.reason}); "
            "start it with `make run` or `gpuyard serve`, or point --url / GPUYARD_URL "
            "at it"
        )
    return f"error: {e.code}: {e.message}"


PROJECT_OPTION = click.option(
    "--project-id", type=int, default=None, help="Project (default: the default project)."
)


def every_page(
    client: GpuyardClient, path: str, key: str, project_id: int | None, per_page: int = 200
) -> list[Any]:
    """Every row of a cursor-paged ``/v1`` list (``key`` names the rows in ``data``),
    following ``pagination.next_cursor``; ``project_id``: one project's only."""
    out: list[Any] = []
    params: dict[str, str | int] = {"per_page": per_page}
    if project_id is not None:
        params["project_id"] = project_id
    while True:
        data = client.request("GET", path, params=params)
        out.extend(data[key])
        cursor = data["pagination"].get("next_cursor")
        if not cursor:
            return out
        params["cursor"] = cursor
