"""A start right after a stop, on real Podman containers: RunPod's Python SDK,
unmodified (``stop_pod`` then at once ``resume_pod``), and the v1 start with
``wait_for_ready``. The container's process ignores SIGTERM, so each stop takes the
server's whole stop timeout and the start surely arrives while it is stopping."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import docker
import httpx
import pytest

from tests.e2e.conftest import DEV_IMAGE
from tests.e2e.test_server_e2e import container_name, running_server, wait_status
from tests.required_parts import need_module

pytestmark = pytest.mark.e2e

runpod = need_module("runpod", how="pip install runpod (make venv)")

# PID 1 without a SIGTERM handler ignores it: the engine kills it after the timeout.
SLOW_TO_STOP = "sleep 3600"
STOP_TIMEOUT_S = "4"


def _create(c: httpx.Client) -> str:
    r = c.post(
        "/v1/clusters",
        json={
            "gpu_type": "NVIDIA RTX A6000",
            "gpu_count": 1,
            "docker_image": DEV_IMAGE,
            "docker_args": SLOW_TO_STOP,
            "volume_gb": 1,
            "memory_gb": 1,
            "cpu_cores": 1,
        },
    )
    assert r.status_code == 201, r.text
    cid: str = r.json()["data"]["id"]
    assert wait_status(c, cid, {"running", "error"})["status"] == "running"
    return cid


def _container_id(engine: docker.DockerClient, name: str) -> str:
    container: Any = engine.containers.get(name)
    return str(container.id)


def test_sdk_resume_right_after_stop_and_v1_wait_for_ready(
    tmp_path: Path,
    engine_url: str,
    engine: docker.DockerClient,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env = {"GPUYARD_STOP_TIMEOUT_S": STOP_TIMEOUT_S}
    with running_server(tmp_path / "home", engine_url, env) as server, server.client() as c:
        # The SDK reads its base URL on every call and its key from the module.
        monkeypatch.setenv("RUNPOD_API_BASE_URL", server.url)
        monkeypatch.setattr(runpod, "api_key", server.key)

        pid = _create(c)
        first = _container_id(engine, container_name(server, pid))
        assert runpod.stop_pod(pid) == {"id": pid, "desiredStatus": "EXITED"}
        resumed = runpod.resume_pod(pid, 1)
        assert resumed["id"] == pid and resumed["desiredStatus"] == "RUNNING"
        detail = c.get(f"/v1/clusters/{pid}").json()["data"]
        assert detail["status"] == "stopping" and detail["desired_status"] == "running"
        data = wait_status(c, pid, {"running"}, timeout=90)
        # A new container (the stop wiped the old one), on one GPU again.
        assert _container_id(engine, container_name(server, pid)) != first
        assert data["gpu_count"] == 1 and len(data["gpu_indices"]) == 1
        events = c.get(f"/v1/clusters/{pid}/events").json()["data"]["events"]
        messages = [e["message"] for e in events]
        assert "start requested while stopping" in messages
        assert [e["to_status"] for e in events if e["to_status"]][-3:] == [
            "stopped",
            "starting",
            "running",
        ]

        assert c.post(f"/v1/clusters/{pid}/stop").status_code == 200
        r = c.post(f"/v1/clusters/{pid}/start", json={"wait_for_ready": True, "timeout_minutes": 2})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["data"]["status"] == "running" and body["meta"]["wait_timed_out"] is False
