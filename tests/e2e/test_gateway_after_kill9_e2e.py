"""A server killed with SIGKILL leaves no process of its own behind: its SSH gateway
(a child of ``gpuyard serve``, in a session of its own) stops within a second, so the
next server's gateway takes the port, and logins follow the keys as they are after the
restart: a key registered since logs in, a key removed since is refused. The real
server as a subprocess, a busybox cluster on this machine's engine, the system ``ssh``;
traffic to 127.0.0.1 only."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.test_server_e2e import ServerProcess, wait_status
from tests.e2e.test_ssh_gateway_e2e import keygen, ssh, wait_port
from tests.helpers import free_port
from tests.required_parts import needs_tools

pytestmark = [
    pytest.mark.e2e,
    needs_tools("ssh", "ssh-keygen", how="apt-get install openssh-client"),
]


def gateways_of(home: Path) -> set[int]:
    """Pids of ``gpuyard ssh-gateway`` processes started for the server at ``home``."""
    found: set[int] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"ssh-gateway" in argv and f"GPUYARD_HOME={home}".encode() in environ:
            found.add(int(entry))
    return found


def public(key: Path) -> str:
    return key.with_suffix(".pub").read_text()


@pytest.fixture
def server(engine_url: str, tmp_path: Path) -> Iterator[tuple[ServerProcess, int]]:
    port = free_port()
    proc = ServerProcess(tmp_path / "home", engine_url, free_port())
    proc.extra_env = {
        "GPUYARD_SSH_PORT": str(port),
        "GPUYARD_SSH_BIND": "127.0.0.1",
        "GPUYARD_SSH_AUTH_FAILURES_PER_MINUTE": "1000",
    }
    try:
        proc.start()
        wait_port(port)
        yield proc, port
    finally:
        proc.cleanup()


def test_a_killed_servers_gateway_goes_and_the_next_one_follows_the_keys(
    server: tuple[ServerProcess, int], tmp_path: Path
) -> None:
    proc, port = server
    old, new = keygen(tmp_path / "old"), keygen(tmp_path / "new")
    with proc.client() as c:
        r = c.post(
            "/v1/ssh-keys", json={"name": "old", "public_key": old.with_suffix(".pub").read_text()}
        )
        assert r.status_code == 201, r.text
        old_key_id = r.json()["data"]["id"]
        r = c.post(
            "/v1/clusters",
            json={"name": "s", "docker_image": "localhost/gpuyard/busybox:latest",
                  "memory_gb": 1, "cpu_cores": 1},
        )  # fmt: skip
        assert r.status_code == 201, r.text
        cid = r.json()["data"]["id"]
        assert wait_status(c, cid, {"running", "error"})["status"] == "running"
    user = str(cid)
    assert ssh(old, port, user, "echo in").stdout.strip() == "in"
    before = gateways_of(proc.home)
    assert before, "the server started no gateway"

    proc.kill9()
    deadline = time.monotonic() + 10
    while gateways_of(proc.home) & before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not gateways_of(proc.home) & before, "the killed server's gateway is still running"

    proc.start()
    wait_port(port)
    with proc.client() as c:
        r = c.post(
            "/v1/ssh-keys", json={"name": "new", "public_key": new.with_suffix(".pub").read_text()}
        )
        assert r.status_code == 201, r.text
        assert c.delete(f"/v1/ssh-keys/{old_key_id}").status_code in (200, 204)
    deadline = time.monotonic() + 30
    while ssh(new, port, user, "echo in").stdout.strip() != "in":
        assert time.monotonic() < deadline, "a key registered after the restart does not log in"
        time.sleep(0.5)
    refused = ssh(old, port, user, "echo in")
    assert refused.returncode != 0 and refused.stdout.strip() != "in", refused
    assert not gateways_of(proc.home) & before
