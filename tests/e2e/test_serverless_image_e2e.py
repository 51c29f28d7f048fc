"""The serverless test image on real Podman: built offline and cached by its recipe hash;
each handler answering over DIRECT_HTTP_PORT; runpod's ``--test_input`` running the echo
handler locally; and the unmodified runpod worker loop inside the image taking jobs from
a stand-in of RunPod's job API (take, stream, done, stop channel) on the host, its
results, streamed chunks and concurrency as runpod sends them. Containers carry an
installation label the test made and are removed after."""

from __future__ import annotations

import json
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

import docker
import httpx
import pytest
from click.testing import CliRunner

from gpuyard.cli.main import cli
from gpuyard.core.ownership import LABEL_INSTALLATION, Ownership
from gpuyard.core.tls_trust import trusted_tls
from gpuyard.devtools.serverless_image import (
    DIRECT_HTTP_PORT,
    SERVERLESS_IMAGE,
    HostPython,
    build_serverless_image,
    default_wheel_dir,
    image_recipe,
    recipe_digest,
)
from tests.e2e.conftest import purge_installation
from tests.helpers import free_port
from tests.required_parts import needs_tools

pytestmark = [
    pytest.mark.e2e,
    needs_tools("podman", "ldd", how="apt-get install podman runc (bash scripts/setup-system.sh)"),
]


def image_id() -> str:
    out = subprocess.run(
        ["podman", "image", "inspect", "--format", "{{.Id}}", SERVERLESS_IMAGE],
        capture_output=True,
        check=True,
    )
    return out.stdout.decode().strip()


@pytest.fixture(scope="module")
def serverless_image(engine_url: str) -> str:
    return build_serverless_image("podman")


@pytest.fixture
def owner(engine_url: str) -> Iterator[Ownership]:
    owner = Ownership.new()
    try:
        yield owner
    finally:
        purge_installation(engine_url, owner.installation_id)


def run_direct(
    engine: docker.DockerClient, image: str, owner: Ownership, handler: str
) -> tuple[str, Any]:
    """A container serving ``handler`` over DIRECT_HTTP_PORT only, answering: (its
    base URL, the container)."""
    port = free_port()
    container = engine.containers.run(
        image,
        name=f"gy-sls-test-{uuid.uuid4().hex[:8]}",
        detach=True,
        environment={"HANDLER": handler, "DIRECT_HTTP_PORT": str(DIRECT_HTTP_PORT)},
        labels={LABEL_INSTALLATION: owner.installation_id},
        ports={f"{DIRECT_HTTP_PORT}/tcp": ("127.0.0.1", port)},
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            httpx.get(f"{base}/health", timeout=1, verify=trusted_tls()).raise_for_status()
            return base, container
        except httpx.HTTPError:
            if time.monotonic() > deadline:
                raise AssertionError(container.logs().decode()[-2000:]) from None
            time.sleep(0.05)


def test_build_is_cached_by_recipe(serverless_image: str) -> None:
    assert image_recipe(serverless_image, "podman") == recipe_digest(
        HostPython.current(), default_wheel_dir()
    )
    before = image_id()
    t0 = time.monotonic()
    assert build_serverless_image("podman") == SERVERLESS_IMAGE
    assert image_id() == before  # the same image: nothing was installed or imported again
    assert time.monotonic() - t0 < 10


def test_cli_builds_it_and_says_when_it_reused_it(serverless_image: str) -> None:
    result = CliRunner().invoke(cli, ["dev-image", "--serverless", "--runtime", "podman"])
    assert result.exit_code == 0, result.output
    assert result.output.strip().splitlines()[-1] == SERVERLESS_IMAGE
    assert "already present, reused" in result.output


@pytest.mark.parametrize(
    ("handler", "body", "expected"),
    [
        ("echo", {"input": {"prompt": "hi", "n": [1, 2]}}, {"prompt": "hi", "n": [1, 2]}),
        ("stream", {"input": {"chunks": 3}}, [{"index": i, "of": 3} for i in range(3)]),
        ("slow", {"input": {"seconds": 0.2}}, {"slept": 0.2, "worker": "local"}),
        ("async", {"input": "x"}, {"async": True, "input": "x"}),
    ],
)
def test_direct_http_runs_the_handler(
    engine: docker.DockerClient,
    serverless_image: str,
    owner: Ownership,
    handler: str,
    body: dict[str, Any],
    expected: Any,
) -> None:
    base, _ = run_direct(engine, serverless_image, owner, handler)
    with httpx.Client(base_url=base, timeout=10, verify=trusted_tls()) as client:
        answer = client.post("/", json=body)
        assert answer.status_code == 200, answer.text
        assert answer.json() == expected
        assert client.post("/", content=b"{not json").status_code == 400
        assert client.post("/", json={"no": "input"}).status_code == 400


def test_direct_http_runs_jobs_concurrently_and_stops_at_once(
    engine: docker.DockerClient, serverless_image: str, owner: Ownership
) -> None:
    base, container = run_direct(engine, serverless_image, owner, "concurrent")
    with ThreadPoolExecutor(4) as pool:
        answers = list(
            pool.map(
                lambda _: httpx.post(
                    base, json={"input": {"seconds": 1}}, timeout=10, verify=trusted_tls()
                ).json(),
                range(4),
            )
        )
    assert max(a["in_flight_max"] for a in answers) == 4
    t0 = time.monotonic()
    container.stop(timeout=10)
    container.reload()
    assert container.attrs["State"]["ExitCode"] == 0
    assert time.monotonic() - t0 < 8  # SIGTERM handled, not the 10 s timeout then SIGKILL


def test_test_input_runs_the_echo_handler_locally(
    engine: docker.DockerClient, serverless_image: str, owner: Ownership
) -> None:
    job = {"input": {"hello": "world"}}
    container = engine.containers.run(
        serverless_image,
        ["python", "-u", "handler.py", "--test_input", json.dumps(job)],
        detach=True,
        labels={LABEL_INSTALLATION: owner.installation_id},
    )
    assert container.wait(timeout=60)["StatusCode"] == 0
    logs = container.logs().decode()
    assert "Job result: {'output': {'hello': 'world'}}" in logs, logs[-2000:]
    assert "Local testing complete" in logs


class FakeJobApi:
    """RunPod's job API as a worker sees it, for one endpoint, on the host: jobs handed
    out once each (``job-take``, ``job-take-batch``), streamed chunks and results
    recorded, an empty stop channel. Waiters are woken by each result."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.queued: list[dict[str, Any]] = []
        self.taken: list[str] = []
        self.results: dict[str, dict[str, Any]] = {}
        self.chunks: dict[str, list[Any]] = {}
        self.pings = 0
        self._cond = threading.Condition()
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return

            def _send(self, status: int, body: Any = None) -> None:
                data = b"" if body is None else json.dumps(body).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True  # a stopped worker's long poll

            def do_GET(self) -> None:
                url = urlparse(self.path)
                if url.path.startswith("/job-stop/"):
                    time.sleep(0.5)  # a long poll with nothing to stop
                    self._send(204)
                elif url.path.startswith(("/job-take/", "/job-take-batch/")):
                    batch = int(parse_qs(url.query).get("batch_size", ["1"])[0])
                    with api._cond:
                        jobs, api.queued = api.queued[:batch], api.queued[batch:]
                        api.taken += [j["id"] for j in jobs]
                    if not jobs:
                        time.sleep(0.1)
                        self._send(204)
                    elif "batch" in url.path:
                        self._send(200, jobs)
                    else:
                        self._send(200, jobs[0])
                elif url.path.startswith("/ping/"):
                    with api._cond:
                        api.pings += 1
                    self._send(200, {})
                else:
                    self._send(404)

            def do_POST(self) -> None:
                url = urlparse(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"null")
                job_id = url.path.rstrip("/").rsplit("/", 1)[-1]
                with api._cond:
                    if url.path.startswith("/job-stream/"):
                        api.chunks.setdefault(job_id, []).append(body)
                    elif url.path.startswith("/job-done/"):
                        api.results[job_id] = body
                    api._cond.notify_all()
                self._send(200, {})

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def env(self, worker_id: str) -> dict[str, str]:
        base = f"http://127.0.0.1:{self.port}"
        return {
            "RUNPOD_WEBHOOK_GET_JOB": f"{base}/job-take/$ID?gpu=test",
            "RUNPOD_WEBHOOK_POST_OUTPUT": f"{base}/job-done/$RUNPOD_POD_ID/$ID?gpu=test",
            "RUNPOD_WEBHOOK_POST_STREAM": f"{base}/job-stream/$RUNPOD_POD_ID/$ID?gpu=test",
            "RUNPOD_WEBHOOK_PING": f"{base}/ping/$RUNPOD_POD_ID?gpu=test",
            "RUNPOD_AI_API_KEY": "test-worker-key",
            "RUNPOD_POD_ID": worker_id,
            "RUNPOD_ENDPOINT_ID": "test-endpoint",
            "RUNPOD_PING_INTERVAL": "1000",
        }

    def queue(self, job_id: str, job_input: Any) -> None:
        with self._cond:
            self.queued.append({"id": job_id, "input": job_input})

    def wait_results(self, ids: list[str], timeout: float) -> dict[str, dict[str, Any]]:
        with self._cond:
            done = self._cond.wait_for(lambda: all(i in self.results for i in ids), timeout)
            assert done, f"results {sorted(self.results)} of {ids}; taken {self.taken}"
            return {i: self.results[i] for i in ids}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def job_api() -> Iterator[FakeJobApi]:
    api = FakeJobApi(free_port())
    yield api
    api.close()


def run_worker(
    engine: docker.DockerClient,
    image: str,
    owner: Ownership,
    api: FakeJobApi,
    handler: str,
    extra_env: dict[str, str] | None = None,
) -> Any:
    worker_id = f"w-{uuid.uuid4().hex[:8]}"
    return engine.containers.run(
        image,
        name=f"gy-sls-worker-{worker_id}",
        detach=True,
        network_mode="host",
        environment={"HANDLER": handler, **api.env(worker_id), **(extra_env or {})},
        labels={LABEL_INSTALLATION: owner.installation_id},
    )


def test_runpod_worker_takes_jobs_and_answers(
    engine: docker.DockerClient, serverless_image: str, owner: Ownership, job_api: FakeJobApi
) -> None:
    job_api.queue("job-1", {"prompt": "hello"})
    job_api.queue("job-2", [1, 2, 3])
    container = run_worker(engine, serverless_image, owner, job_api, "echo")
    try:
        results = job_api.wait_results(["job-1", "job-2"], timeout=60)
    except AssertionError:
        raise AssertionError(container.logs().decode()[-3000:]) from None
    assert results["job-1"] == {"output": {"prompt": "hello"}}
    assert results["job-2"] == {"output": [1, 2, 3]}
    assert sorted(job_api.taken) == ["job-1", "job-2"]  # each taken once
    t0 = time.monotonic()
    container.stop(timeout=10)
    assert time.monotonic() - t0 < 8  # runpod's worker ends on SIGTERM


def test_runpod_worker_streams_chunks_in_order_with_the_aggregate(
    engine: docker.DockerClient, serverless_image: str, owner: Ownership, job_api: FakeJobApi
) -> None:
    job_api.queue("job-s", {"chunks": 5})
    container = run_worker(engine, serverless_image, owner, job_api, "stream")
    try:
        result = job_api.wait_results(["job-s"], timeout=60)["job-s"]
    except AssertionError:
        raise AssertionError(container.logs().decode()[-3000:]) from None
    chunks = [{"index": i, "of": 5} for i in range(5)]
    assert [c["output"] for c in job_api.chunks["job-s"]] == chunks
    assert result["output"] == chunks  # return_aggregate_stream


def test_runpod_worker_runs_several_jobs_at_once(
    engine: docker.DockerClient, serverless_image: str, owner: Ownership, job_api: FakeJobApi
) -> None:
    ids = [f"job-c{i}" for i in range(4)]
    for i in ids:
        job_api.queue(i, {"seconds": 2})
    container = run_worker(
        engine, serverless_image, owner, job_api, "concurrent", {"CONCURRENCY": "4"}
    )
    try:
        results = job_api.wait_results(ids, timeout=60)
    except AssertionError:
        raise AssertionError(container.logs().decode()[-3000:]) from None
    assert max(r["output"]["in_flight_max"] for r in results.values()) >= 2
    assert {r["output"]["worker"] for r in results.values()} == {container.name[14:]}
