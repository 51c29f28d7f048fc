"""Serverless endpoints end to end on real Podman, driven by the unmodified runpod-python
SDK: templates and endpoints made over GraphQL (``runpod.create_template(...,
is_serverless=True)``, ``runpod.create_endpoint``), jobs sent through RunPod's job API
under ``/runpod/v2`` (``runpod.Endpoint``), and taken by unmodified runpod workers in
the serverless test image (``gpuyard dev-image --serverless``).

One server and one image serve the module; each test makes its own endpoints. Waits
poll a state with a deadline, never a fixed sleep. Every container is removed by the
server's installation id after the module (ServerProcess.cleanup).
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import runpod

from gpuyard.core.tls_trust import trusted_tls
from gpuyard.devtools.serverless_image import SERVERLESS_IMAGE, build_serverless_image
from tests.e2e.test_server_e2e import ServerProcess, running_server
from tests.helpers import free_port
from tests.required_parts import needs_tools

pytestmark = [
    pytest.mark.e2e,
    needs_tools("podman", "ldd", how="apt-get install podman runc (bash scripts/setup-system.sh)"),
]

GPU = "NVIDIA RTX A6000"
FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMED_OUT"}


def server_env() -> dict[str, str]:
    """Settings that make the scaler and the queue answer in seconds."""
    return {
        # Workers reach the loopback-only API through the worker listener.
        "GPUYARD_SERVERLESS_WORKER_PORT": str(free_port()),
        "GPUYARD_SERVERLESS_JOB_TAKE_WAIT_S": "2",
        "GPUYARD_SERVERLESS_WORKER_PING_TIMEOUT_S": "15",
        "GPUYARD_SERVERLESS_WORKER_START_GRACE_S": "60",
    }


@pytest.fixture(scope="module")
def serverless_image(engine_url: str) -> str:
    return build_serverless_image("podman")


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, engine_url: str, serverless_image: str
) -> Iterator[ServerProcess]:
    with running_server(tmp_path_factory.mktemp("sls") / "home", engine_url, server_env()) as s:
        yield s


@pytest.fixture(scope="module")
def sdk(server: ServerProcess) -> Iterator[ServerProcess]:
    """The unmodified runpod SDK pointed at ``server``: GraphQL at its base URL, the job
    API at its ``/runpod/v2``, its API key."""
    saved = (runpod.api_key, runpod.endpoint_url_base, os.environ.get("RUNPOD_API_BASE_URL"))
    runpod.api_key = server.key
    runpod.endpoint_url_base = f"{server.url}/runpod/v2"
    os.environ["RUNPOD_API_BASE_URL"] = server.url
    try:
        yield server
    finally:
        runpod.api_key, runpod.endpoint_url_base = saved[0], saved[1]
        if saved[2] is None:
            os.environ.pop("RUNPOD_API_BASE_URL", None)
        else:
            os.environ["RUNPOD_API_BASE_URL"] = saved[2]


def deploy(name: str, handler: str, **endpoint: Any) -> runpod.Endpoint:
    """A template and an endpoint made with the SDK's own calls (GraphQL): ``handler``
    of the serverless image, REQUEST_COUNT 1 and a 2 s idle timeout unless told."""
    template = runpod.create_template(
        name=f"{name}-template",
        image_name=SERVERLESS_IMAGE,
        env={"HANDLER": handler},
        is_serverless=True,
    )
    options: dict[str, Any] = {
        "gpu_ids": GPU,
        "idle_timeout": 2,
        "scaler_type": "REQUEST_COUNT",
        "scaler_value": 1,
        "workers_min": 0,
        "workers_max": 1,
        **endpoint,
    }
    created = runpod.create_endpoint(name=name, template_id=template["id"], **options)
    return runpod.Endpoint(created["id"])


def wait_for(what: str, check: Callable[[], Any], timeout: float, every: float = 0.2) -> Any:
    """``check()``'s first truthy answer, polled until ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"{what}: not within {timeout:.0f} s (last: {last!r})")


def job_state(server: ServerProcess, endpoint_id: str, job_id: str) -> dict[str, Any]:
    with server.client() as c:
        r = c.get(f"/runpod/v2/{endpoint_id}/status/{job_id}")
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def wait_job(
    server: ServerProcess, endpoint_id: str, job_id: str, want: set[str], timeout: float = 90
) -> dict[str, Any]:
    def reached() -> dict[str, Any] | None:
        state = job_state(server, endpoint_id, job_id)
        return state if state["status"] in want else None

    try:
        found: dict[str, Any] = wait_for(f"job {job_id} in {want}", reached, timeout)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{server.log_tail()}") from None
    return found


def endpoint_workers(server: ServerProcess, endpoint_id: str) -> dict[str, int]:
    """The endpoint's worker counts by state (``/v1/endpoints/{id}``)."""
    with server.client() as c:
        r = c.get(f"/v1/endpoints/{endpoint_id}")
    assert r.status_code == 200, r.text
    workers: dict[str, int] = r.json()["data"]["workers"]
    return workers


def job_worker_container(server: ServerProcess, job_id: str) -> tuple[str, str]:
    """(worker id, container name) of the worker holding ``job_id``, from the server's
    database (read-only)."""
    db = sqlite3.connect(f"file:{server.db_path}?mode=ro", uri=True, timeout=10)
    try:
        row = db.execute(
            "SELECT w.id, w.cluster_id FROM serverless_jobs j"
            " JOIN serverless_workers w ON w.id = j.worker_id WHERE j.id = ?",
            (job_id,),
        ).fetchone()
    finally:
        db.close()
    assert row is not None and row[1], f"job {job_id} has no worker with a cluster"
    return str(row[0]), server.installation.container(str(row[1]))


def worker_containers(server: ServerProcess, endpoint_id: str) -> list[str]:
    """The container names of ``endpoint_id``'s workers, from the server's database."""
    db = sqlite3.connect(f"file:{server.db_path}?mode=ro", uri=True, timeout=10)
    try:
        rows = db.execute(
            "SELECT cluster_id FROM serverless_workers"
            " WHERE endpoint_id = ? AND cluster_id IS NOT NULL",
            (endpoint_id,),
        ).fetchall()
    finally:
        db.close()
    return [server.installation.container(str(r[0])) for r in rows]


def container_env(name: str) -> dict[str, str]:
    out = subprocess.run(
        ["podman", "inspect", "--format", "{{json .Config.Env}}", name],
        capture_output=True,
        check=True,
        text=True,
    )
    pairs: list[str] = json.loads(out.stdout)
    return dict(p.split("=", 1) for p in pairs)


def test_sdk_deploys_and_run_sync_run_status_output(sdk: ServerProcess) -> None:
    ep = deploy("e2e-echo", "echo")
    assert ep.run_sync({"prompt": "hi", "n": [1, 2]}, timeout=120) == {"prompt": "hi", "n": [1, 2]}
    job = ep.run({"again": True})
    assert job.output(timeout=60) == {"again": True}
    assert job.status() == "COMPLETED"
    health = ep.health()
    assert health["jobs"]["completed"] >= 2 and health["jobs"]["failed"] == 0
    listed = {e["id"] for e in runpod.get_endpoints()}
    assert ep.endpoint_id in listed


def test_stream_yields_every_chunk_in_order(sdk: ServerProcess) -> None:
    ep = deploy("e2e-stream", "stream")
    job = ep.run({"chunks": 5})
    assert list(job.stream()) == [{"index": i, "of": 5} for i in range(5)]
    assert job.output(timeout=30) == [{"index": i, "of": 5} for i in range(5)]


def test_cancel_and_execution_timeout_stop_the_job_on_the_worker(sdk: ServerProcess) -> None:
    ep = deploy("e2e-slow", "slow", workers_max=1)
    job = ep.run({"seconds": 60})
    wait_job(sdk, ep.endpoint_id, job.job_id, {"IN_PROGRESS"})
    job.cancel()
    assert wait_job(sdk, ep.endpoint_id, job.job_id, FINAL)["status"] == "CANCELLED"
    # The one worker was told to stop the cancelled job: it takes the next at once, and
    # the executionTimeout ends that one too (60 s of work, 45 s of patience).
    timed = ep.run({"input": {"seconds": 60}, "policy": {"executionTimeout": 2000}})
    state = wait_job(sdk, ep.endpoint_id, timed.job_id, FINAL, timeout=45)
    assert state["status"] == "TIMED_OUT", state
    # Both 60 s jobs were stopped on the one worker: it is free long before either
    # would have ended.
    quick = ep.run({"seconds": 0.1})
    assert quick.output(timeout=30)["slept"] == 0.1


def test_twenty_jobs_scale_up_to_workers_max_then_to_zero(sdk: ServerProcess) -> None:
    ep = deploy("e2e-scale", "slow", workers_max=3)
    jobs = [ep.run({"seconds": 1}) for _ in range(20)]
    most = 0

    def all_done() -> bool:
        nonlocal most
        workers = ep.health()["workers"]
        most = max(most, workers["idle"] + workers["running"])
        counts = endpoint_workers(sdk, ep.endpoint_id)
        most = max(most, sum(counts.values()))
        assert most <= 3, (workers, counts)
        return all(job_state(sdk, ep.endpoint_id, j.job_id)["status"] in FINAL for j in jobs)

    wait_for("20 jobs done", all_done, timeout=240, every=0.5)
    outputs = [job_state(sdk, ep.endpoint_id, j.job_id) for j in jobs]
    assert {o["status"] for o in outputs} == {"COMPLETED"}
    assert most >= 2, "the queue of 20 never scaled past one worker"
    assert len({o["output"]["worker"] for o in outputs}) >= 2
    wait_for(
        "workers gone after the idle timeout",
        lambda: sum(endpoint_workers(sdk, ep.endpoint_id).values()) == 0,
        timeout=60,
    )
    assert ep.health()["workers"] == {"idle": 0, "running": 0}


def test_killed_worker_container_gives_its_job_to_another(sdk: ServerProcess) -> None:
    ep = deploy("e2e-kill", "slow", workers_min=2, workers_max=2)
    wait_for("two idle workers", lambda: ep.health()["workers"]["idle"] == 2, timeout=120)
    job = ep.run({"seconds": 8})
    wait_job(sdk, ep.endpoint_id, job.job_id, {"IN_PROGRESS"})
    worker_id, container = job_worker_container(sdk, job.job_id)
    subprocess.run(["podman", "kill", "--signal", "KILL", container], check=True,
                   capture_output=True)  # fmt: skip
    state = wait_job(sdk, ep.endpoint_id, job.job_id, FINAL, timeout=120)
    assert state["status"] == "COMPLETED", state
    assert state["output"]["worker"] != worker_id
    assert ep.health()["jobs"]["retried"] >= 1


def test_kill_9_of_the_server_loses_no_queued_job(
    tmp_path: Path, engine_url: str, serverless_image: str
) -> None:
    with running_server(tmp_path / "home", engine_url, server_env()) as server:
        saved = (runpod.api_key, runpod.endpoint_url_base, os.environ.get("RUNPOD_API_BASE_URL"))
        runpod.api_key = server.key
        runpod.endpoint_url_base = f"{server.url}/runpod/v2"
        os.environ["RUNPOD_API_BASE_URL"] = server.url
        try:
            ep = deploy("e2e-crash", "echo", workers_max=0)
            with ThreadPoolExecutor(5) as pool:
                jobs = list(pool.map(lambda i: ep.run({"i": i}), range(10)))
            assert ep.health()["jobs"]["inQueue"] == 10
            server.kill9()
            server.start()
            with server.client() as c:
                r = c.patch(f"/v1/endpoints/{ep.endpoint_id}", json={"workers_max": 2})
                assert r.status_code == 200, r.text
            for i, job in enumerate(jobs):
                state = wait_job(server, ep.endpoint_id, job.job_id, FINAL, timeout=120)
                assert state["status"] == "COMPLETED" and state["output"] == {"i": i}, state
        finally:
            runpod.api_key, runpod.endpoint_url_base = saved[0], saved[1]
            if saved[2] is None:
                os.environ.pop("RUNPOD_API_BASE_URL", None)
            else:
                os.environ["RUNPOD_API_BASE_URL"] = saved[2]


def test_a_workers_key_answers_for_its_own_endpoint_only(sdk: ServerProcess) -> None:
    ep = deploy("e2e-keys", "echo", workers_min=1)
    other = deploy("e2e-other", "echo", workers_max=0)
    wait_for("a ready worker", lambda: ep.health()["workers"]["idle"] == 1, timeout=120)
    (name,) = worker_containers(sdk, ep.endpoint_id)
    env = container_env(name)
    key, worker_id = env["RUNPOD_AI_API_KEY"], env["RUNPOD_POD_ID"]
    assert env["RUNPOD_ENDPOINT_ID"] == ep.endpoint_id and key != sdk.key
    queued = other.run({"not": "yours"})
    workers = f"{sdk.url}/runpod/v2/workers"
    with httpx.Client(timeout=30, verify=trusted_tls()) as c:
        for path in (
            f"{workers}/{other.endpoint_id}/job-take/{worker_id}",
            f"{workers}/{other.endpoint_id}/job-take-batch/{worker_id}?batch_size=4",
            f"{workers}/{ep.endpoint_id}/job-take/not-{worker_id}",
        ):
            r = c.get(path, headers={"Authorization": key})
            assert r.status_code in (401, 403, 404), (path, r.status_code, r.text)
        r = c.post(
            f"{workers}/{other.endpoint_id}/job-done/{worker_id}/{queued.job_id}",
            headers={"Authorization": key},
            json={"output": "forged"},
        )
        assert r.status_code in (401, 403, 404), r.text
        # A worker key is no API key: neither the user API nor the job API take it.
        bearer = {"Authorization": f"Bearer {key}"}
        assert c.get(f"{sdk.url}/v1/endpoints", headers=bearer).status_code == 401
        r = c.post(f"{sdk.url}/runpod/v2/{ep.endpoint_id}/run", headers=bearer,
                   json={"input": {}})  # fmt: skip
        assert r.status_code == 401, r.text
        # And an account's API key is no worker key.
        r = c.get(f"{workers}/{other.endpoint_id}/job-take/{worker_id}",
                  headers={"Authorization": sdk.key})  # fmt: skip
        assert r.status_code == 401, r.text
    assert job_state(sdk, other.endpoint_id, queued.job_id)["status"] == "IN_QUEUE"
