"""``gpuyard endpoints ...`` against a live server over real HTTP (FakeRuntime): create,
list, get, delete, secret env masked, errors printed as the other commands print them,
another account's key hearing not-found; and ``gpuyard jobs run``'s arguments and the
requests it makes of RunPod's job API, against a small stub of those paths that
records every request."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from gpuyard.cli.main import cli
from gpuyard.core.secret_env import MASK
from gpuyard.services.tenancy.auth import Scope, create_account, issue_key
from gpuyard.testing.fake_runtime import FakeRuntime
from tests.helpers import LiveServer, live_server, make_settings

SECRET = "hf_cli_secret_value_1234"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    with live_server(make_settings(tmp_path / "home"), FakeRuntime()) as live:
        yield live


def invoke(url: str, key: str, home: Path, *args: str) -> Result:
    env = {"GPUYARD_URL": url, "GPUYARD_API_KEY": key, "GPUYARD_HOME": str(home)}
    return CliRunner().invoke(cli, list(args), env=env)


def run(server: LiveServer, *args: str, key: str | None = None) -> Result:
    return invoke(server.url, key or server.key, server.server.ctx.settings.home, *args)


def ok_json(result: Result) -> Any:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def other_key(server: LiveServer) -> str:
    with server.server.ctx.transaction() as session:
        user, account, _ = create_account(session, email="b@example.com", name="b")
        return issue_key(
            session, user_id=user.id, account_id=account.id, name="b", scope=Scope.WRITE
        ).key


def test_endpoints_create_list_get_delete(server: LiveServer) -> None:
    made = ok_json(
        run(
            server, "endpoints", "create", "echo", "--image", "img:1",
            "--gpu-type", "NVIDIA RTX A6000", "--gpu-type", "ADA_24", "--workers-max", "4",
            "--idle-timeout", "9", "--scaler-type", "REQUEST_COUNT", "--scaler-value", "2",
            "--env", "MODE=x", "--secret-env", f"TOKEN_X={SECRET}", "--location", "local",
            "--flashboot", "--json",
        )
    )  # fmt: skip
    eid = made["id"]
    assert made["env"] == {"MODE": "x", "TOKEN_X": MASK} and made["flashboot"] is True
    assert made["workers_max"] == 4 and made["idle_timeout_s"] == 9
    assert "NVIDIA GeForce RTX 4090" in made["gpu_type_ids"]

    listed = run(server, "endpoints", "list")
    assert listed.exit_code == 0 and eid in listed.output and "echo" in listed.output
    assert [e["id"] for e in ok_json(run(server, "endpoints", "list", "--json"))["endpoints"]] == [
        eid
    ]
    shown = run(server, "endpoints", "get", eid)
    assert shown.exit_code == 0 and "REQUEST_COUNT 2" in shown.output
    assert "0 running, 0 idle, 0 starting" in shown.output and SECRET not in shown.output

    taken = run(server, "endpoints", "create", "echo", "--image", "img:1", "--gpu-type", "L4")
    assert taken.exit_code == 1 and "ENDPOINT_EXISTS" in taken.output
    usage = run(server, "endpoints", "create", "x")
    assert usage.exit_code == 2 and "--image or --template" in usage.output
    bad = run(server, "endpoints", "create", "x", "--image", "i", "--gpu-type", "B9000")
    assert bad.exit_code == 1 and "gpu_type_ids" in bad.output

    theirs = run(server, "endpoints", "get", eid, key=other_key(server))
    assert theirs.exit_code == 1 and "ENDPOINT_NOT_FOUND" in theirs.output

    deleted = run(server, "endpoints", "delete", eid)
    assert deleted.exit_code == 0 and "deleted" in deleted.output
    gone = run(server, "endpoints", "get", eid)
    assert gone.exit_code == 1 and "ENDPOINT_NOT_FOUND" in gone.output


class JobApiStub:
    """RunPod's job paths, answering a job that completes on the second status poll and
    streams two chunks; every request is recorded as (method, path, body)."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, Any]] = []
        self.polls = 0
        self.final = "COMPLETED"
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_args: object) -> None:
                pass

            def _answer(self, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"null")
                stub.requests.append(("POST", self.path, body))
                assert self.headers["Authorization"] == "Bearer k"
                if "/runsync" in self.path:
                    self._answer(
                        {"id": "j1", "status": "COMPLETED", "output": {"echo": body["input"]},
                         "delayTime": 3, "executionTime": 5}
                    )  # fmt: skip
                else:
                    self._answer({"id": "j1", "status": "IN_QUEUE"})

            def do_GET(self) -> None:
                stub.requests.append(("GET", self.path, None))
                if "/stream/" in self.path:
                    stub.polls += 1
                    if stub.polls == 1:
                        self._answer({"status": "IN_PROGRESS", "stream": [{"output": "a"}]})
                    else:
                        self._answer({"status": "COMPLETED", "stream": [{"output": "b"}]})
                    return
                stub.polls += 1
                status = stub.final if stub.polls >= 2 else "IN_PROGRESS"
                self._answer({"id": "j1", "status": status, "output": {"n": 1}, "error": "boom"})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def stub() -> Iterator[JobApiStub]:
    s = JobApiStub()
    try:
        yield s
    finally:
        s.close()


def jobs(stub: JobApiStub, tmp_path: Path, *args: str) -> Result:
    return invoke(stub.url, "k", tmp_path, "jobs", "run", *args, "--poll-s", "0.01")


E = "abc123def456gh"


def test_jobs_run_sync(stub: JobApiStub, tmp_path: Path) -> None:
    result = jobs(stub, tmp_path, E, "--input", '{"x": 1}', "--sync", "--wait-ms", "5000")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"echo": {"x": 1}}
    assert stub.requests == [("POST", f"/runpod/v2/{E}/runsync?wait=5000", {"input": {"x": 1}})]


def test_jobs_run_polls_status_until_final(stub: JobApiStub, tmp_path: Path) -> None:
    result = jobs(stub, tmp_path, E, "--input", '"hi"', "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["status"] == "COMPLETED"
    assert stub.requests == [
        ("POST", f"/runpod/v2/{E}/run", {"input": "hi"}),
        ("GET", f"/runpod/v2/{E}/status/j1", None),
        ("GET", f"/runpod/v2/{E}/status/j1", None),
    ]


def test_jobs_run_stream_prints_each_chunk(stub: JobApiStub, tmp_path: Path) -> None:
    result = jobs(stub, tmp_path, E, "--input", "{}", "--stream")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == ['"a"', '"b"']
    paths = [p for _, p, _ in stub.requests]
    stream = f"/runpod/v2/{E}/stream/j1"
    assert paths[:3] == [f"/runpod/v2/{E}/run", stream, stream]


def test_jobs_run_failure_and_arguments(stub: JobApiStub, tmp_path: Path) -> None:
    stub.final = "FAILED"
    failed = jobs(stub, tmp_path, E, "--input", "{}")
    assert failed.exit_code == 1 and "FAILED" in failed.output and "boom" in failed.output
    queued = jobs(stub, tmp_path, E, "--input", "{}", "--no-wait")
    assert queued.exit_code == 0 and queued.stdout.strip() == "job j1 IN_QUEUE"
    before = len(stub.requests)
    for args in (
        ("--input", "{not json"),
        ("--input", "{}", "--sync", "--stream"),
        ("--input", "{}", "--wait-ms", "10"),
        ("--input", "{}", "--sync", "--no-wait"),
        (),
    ):
        refused = jobs(stub, tmp_path, E, *args)
        assert refused.exit_code == 2, (args, refused.output)
    assert len(stub.requests) == before  # nothing was sent
