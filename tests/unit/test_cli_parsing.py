"""Pure parts of the CLI: option parsing, output, key redaction and target resolution."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import click
import pytest

from gpuyard.cli.client import ApiError
from gpuyard.cli.clusters import parse_env, parse_port
from gpuyard.cli.config import DEFAULT_URL, resolve_target
from gpuyard.cli.output import Progress, cell, format_api_error, table
from gpuyard.cli.serve import RedactKeysFilter, redact

KEY = "gy_" + "a1B2c3D4e5" * 4


def test_parse_port_forms() -> None:
    assert parse_port("8888") == {"internal_port": 8888, "protocol": "tcp"}
    assert parse_port("8888/http") == {"internal_port": 8888, "protocol": "http"}
    assert parse_port("53:5353/UDP") == {
        "internal_port": 53,
        "external_port": 5353,
        "protocol": "udp",
    }
    for bad in ("x", "80/sctp", "80:y", ""):
        with pytest.raises(click.BadParameter):
            parse_port(bad)


def test_parse_env() -> None:
    assert parse_env(("A=1", "B=", "C=x=y")) == {"A": "1", "B": "", "C": "x=y"}
    with pytest.raises(click.BadParameter):
        parse_env(("NOVALUE",))
    with pytest.raises(click.BadParameter):
        parse_env(("=v",))


def test_table_aligns_and_fills_blanks() -> None:
    out = table(["ID", "NAME"], [["a", None], ["bbbb", "x"]])
    assert out.splitlines() == ["ID    NAME", "a     -", "bbbb  x"]
    assert cell(2.0) == "2" and cell(0.0014) == "0.0014" and cell(True) == "yes"


def test_cells_never_carry_terminal_escapes_or_bidi_controls() -> None:
    # A name stored before the input rules: shown, not acted on by the terminal.
    assert cell("job\x1b[2J\x07") == "job\ufffd[2J\ufffd"
    assert cell("evil\u202etxt.exe") == "evil\ufffdtxt.exe"
    assert cell("plain name") == "plain name"


def test_format_api_error_lists_details() -> None:
    err = ApiError(
        "INVALID_STATE",
        "cannot start",
        {"current_status": "running", "allowed_actions": ["stop", "terminate"]},
        409,
    )
    assert format_api_error(err).splitlines() == [
        "error: INVALID_STATE: cannot start",
        "  current_status: running",
        "  allowed_actions: stop, terminate",
    ]


def test_progress_plain_lines_only_on_change() -> None:
    stream = io.StringIO()
    p = Progress(stream)
    p.update("starting", 25, "Preparing storage")
    p.update("starting", 25, "Preparing storage")
    p.update("running", 100, "Ready")
    p.finish()
    assert stream.getvalue().splitlines() == [
        "starting    25%  Preparing storage",
        "running    100%  Ready",
    ]


def test_redact_every_key_form() -> None:
    line = (
        f'"GET /v1/x?api_key={KEY}&apikey={KEY}&a=1 HTTP/1.1" '
        f"Authorization: Bearer {KEY} authorization={KEY} {KEY}"
    )
    out = redact(line)
    assert KEY not in out
    assert "api_key=***&apikey=***&a=1" in out
    assert "Authorization: Bearer ***" in out


def test_filter_redacts_uvicorn_style_records_and_tracebacks() -> None:
    record = logging.LogRecord(
        "uvicorn.access", logging.INFO, __file__, 1,
        '%s - "%s %s HTTP/%s" %d', ("1.2.3.4:5", "GET", f"/v1?api_key={KEY}", "1.1", 200),
        None,
    )  # fmt: skip
    assert RedactKeysFilter().filter(record)
    assert KEY not in record.getMessage() and "api_key=***" in record.getMessage()
    try:
        raise ValueError(f"bad key {KEY}\nsecond line")
    except ValueError:
        import sys

        rec = logging.LogRecord("x", logging.ERROR, __file__, 1, "boom", None, sys.exc_info())
    RedactKeysFilter().filter(rec)
    assert rec.exc_text is not None and KEY not in rec.exc_text


def test_resolve_target_order(tmp_path: Path) -> None:
    (tmp_path / "credentials").write_text(
        json.dumps({"url": "http://0.0.0.0:9000", "api_key": "gy_file"})
    )
    env = {"GPUYARD_HOME": str(tmp_path)}
    t = resolve_target(None, None, env)
    assert (t.url, t.api_key) == ("http://127.0.0.1:9000", "gy_file")
    env |= {"GPUYARD_URL": "http://h:1/", "GPUYARD_API_KEY": "gy_env"}
    t = resolve_target(None, None, env)
    assert (t.url, t.api_key) == ("http://h:1", "gy_env")
    t = resolve_target("http://flag:2", "gy_flag", env)
    assert (t.url, t.api_key, t.key_source) == ("http://flag:2", "gy_flag", "--api-key")
    t = resolve_target(None, None, {"GPUYARD_HOME": str(tmp_path / "none")})
    assert (t.url, t.api_key) == (DEFAULT_URL, None)


def test_constants_copied_to_keep_startup_fast_agree() -> None:
    from gpuyard.api.state import KEY_CACHE_TTL_S
    from gpuyard.cli import keys, main
    from gpuyard.runtimes.engines.devimage import DEFAULT_IMAGE
    from gpuyard.services.tenancy.auth import Scope

    assert keys.KEY_CACHE_TTL_S == KEY_CACHE_TTL_S
    assert tuple(s.value for s in Scope) == keys.SCOPES
    assert main.DEV_IMAGE == DEFAULT_IMAGE
