"""``docker_entrypoint`` on real Podman through ``gpuyard serve``: a cluster created
with ENTRYPOINT ``["/bin/sh", "-c"]`` and docker_args ``echo hello-entrypoint; sleep
600`` runs that script (its log has the line, the engine's container has that
ENTRYPOINT and the script as its one argument), and again after a stop and a start."""

from __future__ import annotations

import time
from pathlib import Path

import docker
import httpx
import pytest

from tests.e2e.conftest import DEV_IMAGE
from tests.e2e.test_server_e2e import container_name, gone, running_server, wait_status
from tests.required_parts import needs_tools

pytestmark = [
    pytest.mark.e2e,
    needs_tools("podman", how="apt-get install podman runc (bash scripts/setup-system.sh)"),
]

SCRIPT = "echo hello-entrypoint; sleep 600"


def container_lines(c: httpx.Client, cid: str, want: str, timeout: float = 30) -> list[str]:
    """The container's log lines once one of them is ``want``."""
    deadline = time.monotonic() + timeout
    while True:
        r = c.get(f"/v1/clusters/{cid}/logs", params={"tail": 1000})
        assert r.status_code == 200, r.text
        lines = [e["line"] for e in r.json()["data"] if e["source"] == "container"]
        if want in lines:
            return lines
        assert time.monotonic() < deadline, lines
        time.sleep(0.2)


def test_entrypoint_runs_the_script_and_survives_stop_and_start(
    tmp_path: Path, engine_url: str, engine: docker.DockerClient
) -> None:
    with running_server(tmp_path / "home", engine_url) as server, server.client() as c:
        body = {
            "docker_image": DEV_IMAGE,
            "docker_entrypoint": ["/bin/sh", "-c"],
            "docker_args": SCRIPT,
            "memory_gb": 1,
            "cpu_cores": 1,
        }
        r = c.post("/v1/clusters", json=body)
        assert r.status_code == 201, r.text
        cid = r.json()["data"]["id"]
        try:
            assert wait_status(c, cid, {"running", "error"})["status"] == "running"
            assert "hello-entrypoint" in container_lines(c, cid, "hello-entrypoint")
            config = engine.api.inspect_container(container_name(server, cid))["Config"]
            assert config["Entrypoint"] == ["/bin/sh", "-c"]
            assert config["Cmd"] == [SCRIPT]
            # Still running: the script's sleep, not an exited echo.
            time.sleep(1)
            assert c.get(f"/v1/clusters/{cid}").json()["data"]["status"] == "running"

            assert c.post(f"/v1/clusters/{cid}/stop").status_code == 200
            wait_status(c, cid, {"stopped"})
            assert gone(engine, server, cid)
            r = c.post(f"/v1/clusters/{cid}/start", json={})
            assert r.status_code == 200, r.text
            data = wait_status(c, cid, {"running", "error"})
            assert data["status"] == "running", data
            assert data["docker_entrypoint"] == ["/bin/sh", "-c"]
            config = engine.api.inspect_container(container_name(server, cid))["Config"]
            assert config["Entrypoint"] == ["/bin/sh", "-c"]
            assert config["Cmd"] == [SCRIPT]
            lines = container_lines(c, cid, "hello-entrypoint")
            # The first run's line is kept across the stop, and the second start printed again.
            deadline = time.monotonic() + 30
            while lines.count("hello-entrypoint") < 2:
                assert time.monotonic() < deadline, lines
                time.sleep(0.2)
                lines = container_lines(c, cid, "hello-entrypoint")
        finally:
            c.delete(f"/v1/clusters/{cid}")
            wait_status(c, cid, {"terminated"})
        assert gone(engine, server, cid)
