"""With ``--json`` a failing HTTP command prints the API's error as one JSON object on
stderr (and exits 1); without it the human ``error: CODE: message`` stays. Real server
(FakeRuntime) over real HTTP."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from gpuyard.cli.main import cli
from gpuyard.testing.fake_runtime import FakeRuntime
from tests.helpers import LiveServer, free_port, live_server, make_settings


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    with live_server(make_settings(tmp_path / "home"), FakeRuntime()) as live:
        yield live


def run(url: str, key: str, *args: str) -> Result:
    env = {"GPUYARD_URL": url, "GPUYARD_API_KEY": key, "GPUYARD_HOME": "/nonexistent-gy"}
    return CliRunner().invoke(cli, list(args), env=env)


def error_of(result: Result) -> dict[str, Any]:
    assert result.exit_code == 1, result.output
    assert result.stdout == ""
    body = json.loads(result.stderr)
    assert set(body) == {"error"}
    err: dict[str, Any] = body["error"]
    return err


def test_not_found_is_json_with_the_api_code_and_status(server: LiveServer) -> None:
    err = error_of(run(server.url, server.key, "clusters", "get", "abcdefghijklmn", "--json"))
    assert err["status"] == 404 and err["code"].endswith("NOT_FOUND")
    assert err["message"] and isinstance(err["details"], dict)


def test_root_json_flag_counts_too(server: LiveServer) -> None:
    err = error_of(run(server.url, server.key, "--json", "clusters", "get", "abcdefghijklmn"))
    assert err["status"] == 404


def test_another_command_group_answers_the_same_way(server: LiveServer) -> None:
    err = error_of(run(server.url, server.key, "hosts", "get", "999999", "--json"))
    assert err["status"] == 404 and err["code"].endswith("NOT_FOUND")


def test_bad_key_is_json_401(server: LiveServer) -> None:
    err = error_of(run(server.url, "gy_not_a_key", "clusters", "list", "--json"))
    assert err["status"] == 401 and err["code"]


def test_unreachable_server_is_json() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    err = error_of(run(url, "gy_x", "clusters", "list", "--json"))
    assert err["code"] == "SERVER_UNREACHABLE" and err["status"] is None
    assert err["details"]["url"] == url and err["details"]["reason"]


def test_without_json_the_message_stays_human(server: LiveServer) -> None:
    result = run(server.url, server.key, "clusters", "get", "abcdefghijklmn")
    assert result.exit_code == 1
    assert result.stderr.startswith("error: ") and "NOT_FOUND" in result.stderr
    with pytest.raises(json.JSONDecodeError):
        json.loads(result.stderr)
