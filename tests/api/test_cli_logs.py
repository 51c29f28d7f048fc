"""``gpuyard clusters logs`` against a real server (FakeRuntime): a page, ``--tail``,
``--json``, errors, control characters, and ``-f`` until the cluster is terminated."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from gpuyard.cli.main import cli
from gpuyard.testing.fake_runtime import FakeRuntime
from tests.helpers import LiveServer, live_server, make_settings


@pytest.fixture
def runtime() -> FakeRuntime:
    return FakeRuntime()


@pytest.fixture
def server(tmp_path: Path, runtime: FakeRuntime) -> Iterator[LiveServer]:
    with live_server(make_settings(tmp_path / "home"), runtime) as live:
        yield live


def run(server: LiveServer, *args: str) -> Result:
    env = {
        "GPUYARD_URL": server.url,
        "GPUYARD_API_KEY": server.key,
        "GPUYARD_HOME": str(server.server.ctx.settings.home),
    }
    return CliRunner().invoke(cli, list(args), env=env)


def cluster(server: LiveServer, runtime: FakeRuntime, *lines: str) -> str:
    with server.client() as c:
        r = c.post("/v1/clusters", json={"gpu_type": "NVIDIA RTX A6000", "docker_image": "img"})
        assert r.status_code == 201, r.text
        cid: str = r.json()["data"]["id"]
    assert server.server.reconciler.wait_idle(10)
    runtime.containers[cid].log_lines.extend(lines)
    return cid


def test_logs_prints_output_and_events(server: LiveServer, runtime: FakeRuntime) -> None:
    cid = cluster(server, runtime, "hello", "world")
    result = run(server, "clusters", "logs", cid)
    assert result.exit_code == 0, result.output
    out = result.stdout.splitlines()
    assert any(line.endswith(" hello") for line in out)
    assert any("[gpuyard] status: starting -> running" in line for line in out)
    last = run(server, "clusters", "logs", cid, "--tail", "1")
    assert len(last.stdout.splitlines()) == 1
    data = json.loads(run(server, "clusters", "logs", cid, "--json").stdout)
    assert {e["source"] for e in data} == {"container", "system"}
    assert [e["line"] for e in data if e["source"] == "container"][-2:] == ["hello", "world"]


def test_logs_errors(server: LiveServer, runtime: FakeRuntime) -> None:
    missing = run(server, "clusters", "logs", "nosuchcluster1")
    assert missing.exit_code == 1 and "CLUSTER_NOT_FOUND" in missing.stderr
    cid = cluster(server, runtime)
    assert run(server, "clusters", "logs", cid, "--tail", "6000").exit_code == 2
    bad = run(server, "clusters", "logs", cid, "--since", "soon")
    assert bad.exit_code == 1 and "VALIDATION_ERROR" in bad.stderr


def test_control_characters_are_shown_not_obeyed(server: LiveServer, runtime: FakeRuntime) -> None:
    cid = cluster(server, runtime, "\x1b[31mred\tcell")
    safe = run(server, "clusters", "logs", cid).stdout
    assert "\x1b" not in safe and "\ufffd[31mred\tcell" in safe
    assert "\x1b[31mred" in run(server, "clusters", "logs", cid, "--raw").stdout


def test_follow_prints_new_lines_until_terminated(server: LiveServer, runtime: FakeRuntime) -> None:
    cid = cluster(server, runtime, "before")
    results: list[Result] = []
    follow = threading.Thread(
        target=lambda: results.append(run(server, "clusters", "logs", cid, "-f", "--tail", "1"))
    )
    follow.start()
    # The server attaches to the container (a thread named for the cluster, see
    # api/rest/log_follow.py) only after the stream's first page was read and sent: a line
    # written from then on comes after that page, never in it.
    deadline = time.monotonic() + 30
    while not any(t.name == f"logs-{cid}" for t in threading.enumerate()):
        assert follow.is_alive(), results
        assert time.monotonic() < deadline, "the follow never attached to the container"
        time.sleep(0.01)
    runtime.containers[cid].log_lines.append("while following")
    time.sleep(0.5)
    with server.client() as c:
        assert c.delete(f"/v1/clusters/{cid}").status_code == 200
    follow.join(timeout=30)
    assert not follow.is_alive()
    result = results[0]
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert out.index("while following") < out.index("-> terminated")
    # --tail 1: only the last entry (whichever it is) came before the new line.
    lines = out.splitlines()
    assert next(i for i, line in enumerate(lines) if "while following" in line) == 1, out
