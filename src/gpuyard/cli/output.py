"""Human output (aligned tables, key/value blocks, a progress line), ``--json`` output
and the one error format: ``error: CODE: message`` on stderr."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any, TextIO

import click

from gpuyard.cli.client import ApiError, ServerUnreachable
from gpuyard.core.errors import GpuyardError
from gpuyard.core.input_rules import shown_safely

JSON = dict[str, Any]


def print_json(data: Any) -> None:
    """The raw ``data`` as indented JSON on stdout (the ``--json`` contract)."""
    click.echo(json.dumps(data, indent=2, sort_keys=False))


def cell(value: Any) -> str:
    """A value as a table cell: ``-`` for None/empty, ``yes``/``no`` for booleans;
    control and bidirectional-text characters shown as U+FFFD (a name stored before
    the input rules must not drive the terminal)."""
    if value is None or value == "" or value == [] or value == {}:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4f}".rstrip("0").rstrip(".") if value else "0"
    return shown_safely(str(value))


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Columns left-aligned to their widest cell, two spaces apart, no trailing blanks."""
    cells = [[cell(v) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, v in enumerate(row):
            widths[i] = max(widths[i], len(v))
    lines = []
    for row in [list(headers), *cells]:
        lines.append("  ".join(v.ljust(widths[i]) for i, v in enumerate(row)).rstrip())
    return "\n".join(lines)


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], empty: str) -> None:
    click.echo(table(headers, rows) if rows else empty)


def human_bytes(value: object, unknown: str = "-") -> str:
    """A byte count in binary units (``12.3 MiB``); ``unknown`` for anything else."""
    if not isinstance(value, int) or isinstance(value, bool):
        return unknown
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


def key_values(pairs: Sequence[tuple[str, Any]]) -> str:
    """``label:  value`` lines with the values aligned; None values are skipped."""
    shown = [(k, cell(v)) for k, v in pairs if v is not None]
    width = max((len(k) for k, _ in shown), default=0) + 1
    return "\n".join(f"{(k + ':').ljust(width)}  {v}" for k, v in shown)


def _brief(value: Any, limit: int = 120) -> str:
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    return text if len(text) <= limit else text[: limit - 3] + "..."


def format_api_error(err: ApiError) -> str:
    """``error: CODE: message`` plus one indented line per detail (validation errors
    listed by field, other values shortened)."""
    lines = [f"error: {err.code}: {err.message}"]
    for key, value in err.details.items():
        if key == "errors" and isinstance(value, list):
            if len(value) > 1:
                for e in value[:10]:
                    if isinstance(e, dict):
                        lines.append(f"  {e.get('field')}: {e.get('message')}")
            continue
        if key == "field":
            continue
        if isinstance(value, list):
            value = ", ".join(_brief(v, 40) for v in value)
        lines.append(f"  {key}: {_brief(value)}")
    return "\n".join(lines)


def error_json(err: ApiError | ServerUnreachable | GpuyardError) -> str:
    """The ``--json`` form of a failure, one line: ``{"error": {"code", "message",
    "status", "details"}}`` with the API's own code, message, HTTP status and details;
    an unreachable server is ``SERVER_UNREACHABLE`` (status null, its url and reason in
    details), a local failure its own code (status null)."""
    if isinstance(err, ApiError):
        body: JSON = {
            "code": err.code,
            "message": err.message,
            "status": err.status,
            "details": err.details,
        }
    elif isinstance(err, ServerUnreachable):
        body = {
            "code": "SERVER_UNREACHABLE",
            "message": f"the gpuyard server is not reachable at {err.url} ({err.reason})",
            "status": None,
            "details": {"url": err.url, "reason": err.reason},
        }
    else:
        body = {"code": err.code, "message": err.message, "status": None, "details": err.details}
    return json.dumps({"error": body}, separators=(",", ":"), default=str)


def fail(message: str) -> None:
    """Print ``error: message`` to stderr and exit 1."""
    click.echo(f"error: {message}", err=True)
    raise SystemExit(1)


class Progress:
    """Startup progress while waiting: on a TTY one bar redrawn in place (``\\r``), else
    one plain line each time the status, percentage or step changes. Writes to stderr
    so ``--json`` output on stdout stays parseable."""

    WIDTH = 30

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream or sys.stderr
        self._tty = bool(getattr(self._stream, "isatty", lambda: False)())
        self._last: tuple[str, int, str] | None = None
        self._drawn = 0

    def update(self, status: str, percentage: int, step: str) -> None:
        state = (status, percentage, step)
        if state == self._last:
            return
        self._last = state
        if self._tty:
            filled = self.WIDTH * max(0, min(percentage, 100)) // 100
            bar = "#" * filled + "-" * (self.WIDTH - filled)
            line = f"[{bar}] {percentage:3d}%  {status}: {step}"
            pad = max(0, self._drawn - len(line))
            self._stream.write("\r" + line + " " * pad)
            self._drawn = len(line)
        else:
            self._stream.write(f"{status:<10} {percentage:3d}%  {step}\n")
        self._stream.flush()

    def finish(self) -> None:
        """End the in-place line (TTY only) so later output starts on a fresh line."""
        if self._tty and self._drawn:
            self._stream.write("\n")
            self._stream.flush()
            self._drawn = 0


def print_events(events: list[dict[str, Any]]) -> None:
    """Events (a cluster's or a training cluster's) as a table, oldest first."""
    rows = [
        [
            e.get("at"),
            e.get("type"),
            f"{e.get('from_status') or '-'} -> {e.get('to_status')}" if e.get("to_status") else "",
            e.get("message"),
        ]
        for e in events
    ]
    print_table(["AT", "TYPE", "STATUS", "MESSAGE"], rows, "no events")
