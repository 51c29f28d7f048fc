"""RunPod REST v2 pods on real Podman, the way REST-v2 provisioners use them: create a
pod with ``ports: ["22/tcp"]`` (the account's SSH key registered), poll
``GET /runpod/v2/pods/{id}`` until ``runtime.ports`` shows 22's public port, SSH in
with the system ssh client and run a command, read the container's output from the
logs stream, then DELETE and see it TERMINATED and gone from the list.

The pod runs sshd from the Slurm node image (openssh-server; host keys made per
container). Everything belongs to the server the test starts and is removed by its
installation id; traffic goes to 127.0.0.1 only.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpuyard.runtimes.slurm.image import SLURM_IMAGE, build_slurm_image
from tests.contract.runpod_v2 import check_answer
from tests.e2e.test_server_e2e import ServerProcess
from tests.e2e.test_ssh_gateway_e2e import keygen, ssh, wait_port
from tests.helpers import free_port
from tests.required_parts import needs_tools

pytestmark = [
    pytest.mark.e2e,
    needs_tools("podman", "ssh", "ssh-keygen", how="apt-get install podman openssh-client"),
]

V2 = "/runpod/v2"
MARKER = "pod-says-hello"
# RunPod's images' convention: the account's keys arrive as PUBLIC_KEY (startSsh).
SSHD = (
    f"sh -c 'echo {MARKER} && mkdir -p /run/sshd /root/.ssh && chmod 700 /root/.ssh "
    '&& echo "$PUBLIC_KEY" > /root/.ssh/authorized_keys && chmod 600 /root/.ssh/authorized_keys '
    "&& ssh-keygen -A >/dev/null && exec /usr/sbin/sshd -D -e'"
)


@pytest.fixture(scope="module")
def server(engine_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    home = tmp_path_factory.mktemp("runpod-v2")
    srv = ServerProcess(home / "home", engine_url, free_port())
    gateway = free_port()
    # The SSH gateway too: the pod's ssh.proxy names it.
    srv.extra_env = {"GPUYARD_SSH_PORT": str(gateway), "GPUYARD_SSH_BIND": "127.0.0.1"}
    try:
        srv.start()
        wait_port(gateway)
        yield srv
    finally:
        srv.cleanup()


def _public_ssh(pod: dict[str, Any]) -> dict[str, Any] | None:
    runtime = pod.get("runtime") or {}
    for port in runtime.get("ports") or []:
        if port["private"] == 22 and port["public"]:
            found: dict[str, Any] = port
            return found
    return None


def poll_ssh_port(c: httpx.Client, pod_id: str, timeout_s: float = 180) -> dict[str, Any]:
    """Poll the pod as a provisioner does until 22/tcp has its public port."""
    deadline = time.monotonic() + timeout_s
    while True:
        r = c.get(f"{V2}/pods/{pod_id}")
        assert r.status_code == 200, r.text
        pod: dict[str, Any] = r.json()
        check_answer("GET", "/v2/pods/{id}", 200, pod)
        assert pod["status"] != "ERROR", pod
        if _public_ssh(pod) is not None:
            return pod
        assert time.monotonic() < deadline, pod
        time.sleep(0.5)


def test_a_pod_is_reached_over_ssh_and_deleted(server: ServerProcess, tmp_path: Path) -> None:
    build_slurm_image("podman", SLURM_IMAGE)
    key = keygen(tmp_path / "id")
    with server.client() as c:
        r = c.post(
            "/v1/ssh-keys",
            json={"name": "laptop", "public_key": key.with_suffix(".pub").read_text()},
        )
        assert r.status_code == 201, r.text
        body = {
            "name": "v2-ssh",
            "image": SLURM_IMAGE,
            "args": SSHD,
            "ports": ["22/tcp"],
            "gpu": {"id": "NVIDIA RTX A6000", "count": 1},
            "startSsh": True,
            "env": {"POD_ENV": "from-v2"},
        }
        r = c.post(f"{V2}/pods", json=body)
        assert r.status_code == 201, r.text
        pod = r.json()
        check_answer("POST", "/v2/pods", 201, pod)
        pod_id = pod["id"]
        pod = poll_ssh_port(c, pod_id)
        assert pod["status"] == "RUNNING"
        port = _public_ssh(pod)
        assert port is not None and port["ip"] == "127.0.0.1", port
        direct = pod["ssh"]["direct"]
        assert direct == {
            "host": "127.0.0.1",
            "port": port["public"],
            "username": "root",
            "command": f"ssh root@127.0.0.1 -p {port['public']}",
        }
        wait_port(direct["port"])
        deadline = time.monotonic() + 60
        while True:
            done = ssh(key, direct["port"], "root", "echo in-pod:$(hostname | wc -c)")
            if done.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(1)  # sshd may still be making its host keys
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("in-pod:"), done.stdout
        proxy = pod["ssh"]["proxy"]
        gateway = int(server.extra_env["GPUYARD_SSH_PORT"])
        assert (proxy["port"], proxy["username"]) == (gateway, pod_id), proxy
        assert proxy["command"] == f"ssh {pod_id}@{proxy['host']} -p {gateway}"
        via = ssh(key, gateway, pod_id, "echo via-gateway")
        assert via.stdout == "via-gateway\n", via.stderr

        # The container's own output, from the logs stream (what is there, then end).
        r = c.get(f"{V2}/pods/{pod_id}/logs", params={"source": "container", "follow": "false"})
        assert r.status_code == 200, r.text
        lines = [json.loads(x[5:])["line"] for x in r.text.splitlines() if x.startswith("data:")]
        assert MARKER in lines, lines

        r = c.delete(f"{V2}/pods/{pod_id}")
        assert r.status_code == 204, r.text
        deadline = time.monotonic() + 60
        while True:
            pod = c.get(f"{V2}/pods/{pod_id}").json()
            if pod["status"] == "TERMINATED" and pod["actions"] == []:
                break
            assert time.monotonic() < deadline, pod
            time.sleep(0.5)
        listed = c.get(f"{V2}/pods").json()
        check_answer("GET", "/v2/pods", 200, listed)
        # Terminating shows TERMINATED; once terminated it leaves the list.
        deadline = time.monotonic() + 60
        while any(p["id"] == pod_id for p in listed["pods"]):
            assert time.monotonic() < deadline, listed
            time.sleep(0.5)
            listed = c.get(f"{V2}/pods").json()
        with socket.socket() as s:
            s.settimeout(2)
            assert s.connect_ex(("127.0.0.1", direct["port"])) != 0, "sshd still answers"
