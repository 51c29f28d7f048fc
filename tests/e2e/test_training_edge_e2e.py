"""A training cluster's SSH endpoint is served by the host's kernel, not by the API
process: ``kill -9`` of ``gpuyard serve`` keeps an open SSH session to the controller
alive, and new connections still reach it (the real server, real Podman nodes, the
system ``ssh`` client)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuyard.runtimes.slurm.image import SLURM_IMAGE
from tests.e2e.test_server_e2e import ServerProcess
from tests.e2e.test_training_e2e import (
    BASE,
    RESERVED,
    Ssh,
    connect,
    slurm_images,
    until,
    wait_running,
)
from tests.helpers import free_port

pytestmark = pytest.mark.e2e

__all__ = ["slurm_images"]  # the fixture, used by name


@pytest.fixture
def server(tmp_path: Path, engine_url: str, slurm_images: str) -> Iterator[ServerProcess]:
    srv = ServerProcess(tmp_path / "home", engine_url, free_port())
    srv.extra_env = {
        "GPUYARD_RESERVED_IPS": RESERVED,
        "GPUYARD_TRAINING_BIND_ADDRESS": "127.0.0.1",
    }
    srv.start()
    try:
        yield srv
    finally:
        # A killed server leaves its rules in place (by design): the clean-up removes
        # them with the installation's containers (purge_installation).
        srv.cleanup()


def test_kill_9_of_the_api_keeps_an_open_ssh_session_to_the_controller(
    server: ServerProcess, tmp_path: Path
) -> None:
    ssh = Ssh(tmp_path)
    key, pub = ssh.keygen("user")
    with server.client() as c:
        project = c.get("/v1/projects").json()["data"]
        projects = project if isinstance(project, list) else project["projects"]
        params = {"project_id": projects[0]["id"], "location": "local"}
        k = c.post("/v1/ssh-keys", json={"name": "user", "public_key": pub}).json()["data"]
        images = c.get("/v1/images").json()["data"]
        images = images if isinstance(images, list) else images["images"]
        base = next(i for i in images if i["image"] == SLURM_IMAGE)
        created = c.post(
            BASE,
            params=params,
            json={
                "name": "edge",
                "image_version_id": base["id"],
                "ssh_key_ids": [k["id"]],
                "no_of_nodes": 1,
                "gpu_type": "NVIDIA RTX A6000",
                "gpus_per_node": 1,
                "cpus_per_node": 1,
                "memory_gb_per_node": 1,
            },
        )
        assert created.status_code == 201, created.json()
        cid = created.json()["data"]["id"]
        cluster = wait_running(c, cid, params)
        port = cluster["ssh"]["port"]
        ip = c.post("/v1/reserved-ips", params={"project_id": params["project_id"]}).json()["data"]
        r = c.put(
            f"{BASE}{cid}/", params=params, json={"action": "attach_ip", "reserved_ip_id": ip["id"]}
        )
        assert r.status_code == 200, r.json()
        until(lambda: connect(ip["address"], 22), 30, "reserved IP reachable")
    controller = f"{server.installation.training_prefix(cid)}-controller"

    # An interactive session: each line sent is answered from the controller.
    argv = [
        "ssh", "-i", str(key), "-p", str(port), "-o", "StrictHostKeyChecking=no",
        "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
        "-o", "LogLevel=ERROR", "root@127.0.0.1",
        "while read line; do echo \"$(hostname) $line\"; done",
    ]  # fmt: skip
    session = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert session.stdin is not None and session.stdout is not None
        session.stdin.write("before\n")
        session.stdin.flush()
        assert session.stdout.readline().strip() == f"{controller} before"

        server.kill9()

        session.stdin.write("after\n")
        session.stdin.flush()
        assert session.stdout.readline().strip() == f"{controller} after", (
            session.poll(),
            session.stderr.read() if session.poll() is not None and session.stderr else "",
        )
        # New connections still reach it, on the port and on the reserved IP.
        out = ssh.run(key, "127.0.0.1", port, "hostname")
        assert out.stdout.strip() == controller, out.stderr
        out = ssh.run(key, ip["address"], 22, "hostname")
        assert out.stdout.strip() == controller, out.stderr
        session.stdin.close()
        assert session.wait(timeout=30) == 0
    finally:
        if session.poll() is None:
            session.kill()
            session.wait()
