"""The SSH gateway, for real: ``gpuyard serve`` starts it as its own process, and the
system ``ssh``/``scp`` (and an asyncssh client for a pty) log into Podman containers
through it, by the exec path (busybox, no sshd) and the sshd path (the Slurm node
image running sshd with port 22 published).

Everything the tests make belongs to the servers they start and is removed by
installation id (ServerProcess.cleanup). Traffic goes to 127.0.0.1 only.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncssh
import httpx
import pytest

from gpuyard.core.tls_trust import trusted_tls
from gpuyard.runtimes.slurm.image import SLURM_IMAGE, build_slurm_image
from tests.e2e.conftest import DEV_IMAGE
from tests.e2e.test_network_isolation import as_key, new_account_key
from tests.e2e.test_server_e2e import ServerProcess, wait_status
from tests.helpers import free_port
from tests.required_parts import needs_tools

pytestmark = [
    pytest.mark.e2e,
    needs_tools("podman", "ssh", "scp", "ssh-keygen", how="apt-get install podman openssh-client"),
]

# Start sshd in the Slurm node image (it has openssh-server; host keys are made per
# container) instead of its node entrypoint.
SSHD_ARGS = "sh -c 'mkdir -p /run/sshd && ssh-keygen -A >/dev/null && exec /usr/sbin/sshd -D -e'"


def keygen(path: Path) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path


def wait_port(port: int, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as s:
            s.settimeout(0.5)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise AssertionError(f"nothing listens on 127.0.0.1:{port}")


def ssh_argv(key: Path, port: int, *, tool: str = "ssh", quiet: bool = True) -> list[str]:
    argv = [
        tool, "-i", str(key),
        "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
        "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10",
    ]  # fmt: skip
    if quiet:
        argv += ["-o", "LogLevel=ERROR"]
    return argv + (["-P", str(port)] if tool == "scp" else ["-p", str(port)])


def ssh(
    key: Path, port: int, user: str, command: str, *, quiet: bool = True
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*ssh_argv(key, port, quiet=quiet), f"{user}@127.0.0.1", command],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip


class Env:
    """One server with its gateway, two accounts, their keys and clusters."""

    def __init__(self, server: ServerProcess, gateway_port: int, keys: Path) -> None:
        self.server = server
        self.port = gateway_port
        self.key_a = keygen(keys / "a")
        self.key_a2 = keygen(keys / "a2")  # registered to no one
        self.key_b = keygen(keys / "b")
        self.a = server.client()
        self.b = as_key(server, new_account_key(server, "bob@example.com"))
        for client, key, name in ((self.a, self.key_a, "laptop"), (self.b, self.key_b, "bobs")):
            r = client.post(
                "/v1/ssh-keys",
                json={"name": name, "public_key": key.with_suffix(".pub").read_text()},
            )
            assert r.status_code == 201, r.text

    def create(self, client: httpx.Client, **body: Any) -> str:
        body = {"name": "ssh", "docker_image": DEV_IMAGE, "memory_gb": 1, "cpu_cores": 1, **body}
        r = client.post("/v1/clusters", json=body)
        assert r.status_code == 201, r.text
        cid: str = r.json()["data"]["id"]
        return cid


@pytest.fixture(scope="module")
def env(engine_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    home = tmp_path_factory.mktemp("ssh-gw")
    port = free_port()
    server = ServerProcess(home / "home", engine_url, free_port())
    server.extra_env = {
        "GPUYARD_SSH_PORT": str(port),
        "GPUYARD_SSH_BIND": "127.0.0.1",
        # Many refusals are part of these tests; the limiter has a test of its own.
        "GPUYARD_SSH_AUTH_FAILURES_PER_MINUTE": "1000",
    }
    try:
        server.start()
        wait_port(port)
        yield Env(server, port, home)
    finally:
        server.cleanup()


@pytest.fixture(scope="module")
def exec_cluster(env: Env) -> str:
    cid = env.create(env.a, env={"GPU_ENV": "h100-x8"})
    data = wait_status(env.a, cid, {"running", "error"})
    assert data["status"] == "running", data
    return cid


def test_exec_path_runs_commands_with_env_and_exit_codes(env: Env, exec_cluster: str) -> None:
    cid = exec_cluster
    done = ssh(env.key_a, env.port, cid, "echo $GPU_ENV")
    assert (done.returncode, done.stdout) == (0, "h100-x8\n"), done.stderr
    assert ssh(env.key_a, env.port, cid, "exit 3").returncode == 3
    split = ssh(env.key_a, env.port, cid, "echo out; echo err >&2; exit 1")
    assert (split.returncode, split.stdout, split.stderr) == (1, "out\n", "err\n")
    # stdin reaches the process and its EOF ends it.
    piped = subprocess.run(
        [*ssh_argv(env.key_a, env.port), f"{cid}@127.0.0.1", "wc -c"],
        input="x" * 100_000, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert piped.stdout.strip() == "100000", piped.stderr
    # The account's keys are in the container's environment too (RunPod's convention).
    pub = ssh(env.key_a, env.port, cid, 'printf %s "$PUBLIC_KEY"').stdout
    assert env.key_a.with_suffix(".pub").read_text().split()[1] in pub

    events = env.a.get(f"/v1/clusters/{cid}/events").json()["data"]["events"]
    logins = [e for e in events if e["type"] == "ssh_login"]
    assert logins and "'laptop'" in logins[-1]["message"]
    assert "127.0.0.1" in logins[-1]["message"] and "via exec" in logins[-1]["message"]
    assert "AAAA" not in logins[-1]["message"]  # the key itself is never written


def test_other_keys_are_refused_with_a_message(env: Env, exec_cluster: str) -> None:
    refused = ssh(env.key_a2, env.port, exec_cluster, "true", quiet=False)
    assert refused.returncode == 255 and refused.stdout == ""
    assert "gpuyard: key SHA256:" in refused.stderr and "Permission denied" in refused.stderr
    unknown = ssh(env.key_a, env.port, "zzzzzzzzzzzzzz", "true", quiet=False)
    assert unknown.returncode == 255 and "no such cluster" in unknown.stderr


def test_cross_account_probe_never_gets_in(env: Env, exec_cluster: str) -> None:
    bobs = env.create(env.b)
    assert wait_status(env.b, bobs, {"running", "error"})["status"] == "running"
    assert ssh(env.key_b, env.port, bobs, "echo bob").stdout == "bob\n"
    successes = 0
    for _ in range(5):
        for key, cid in ((env.key_b, exec_cluster), (env.key_a, bobs), (env.key_a2, bobs)):
            done = ssh(key, env.port, cid, "echo in")
            successes += done.returncode == 0 or "in" in done.stdout
    assert successes == 0


def test_pty_session_with_window_changes(env: Env, exec_cluster: str) -> None:
    async def session() -> tuple[str, int | None]:
        async with asyncssh.connect(
            "127.0.0.1", env.port, username=exec_cluster, client_keys=[str(env.key_a)],
            known_hosts=None, agent_path=None, config=None,
        ) as conn:  # fmt: skip
            proc = await conn.create_process(term_type="xterm", term_size=(100, 30))
            proc.stdin.write("stty size; echo $((6 * 7))\n")
            out = ""
            while "42" not in out.split("$((6 * 7))")[-1]:
                out += await asyncio.wait_for(proc.stdout.read(4096), 10)
            proc.change_terminal_size(132, 50)
            # The resize reaches the engine apart from the typed input: ask until the
            # shell sees it (a loaded machine may take longer than a keystroke).
            resized = ""
            deadline = time.monotonic() + 20
            while "50 132" not in resized and time.monotonic() < deadline:
                proc.stdin.write("stty size\n")
                with contextlib.suppress(TimeoutError):
                    resized += await asyncio.wait_for(proc.stdout.read(4096), 1)
            proc.stdin.write("exit 5\n")
            result = await asyncio.wait_for(proc.wait(), 10)
            return out + resized + str(result.stdout), result.exit_status

    out, status = asyncio.run(session())
    assert "30 100" in out and "42" in out and "50 132" in out, out
    assert status == 5


def test_stopped_cluster_is_refused_with_its_status(env: Env) -> None:
    cid = env.create(env.a)
    assert wait_status(env.a, cid, {"running", "error"})["status"] == "running"
    assert env.a.post(f"/v1/clusters/{cid}/stop").status_code == 200
    wait_status(env.a, cid, {"stopped"})
    done = ssh(env.key_a, env.port, cid, "true", quiet=False)
    assert done.returncode == 255 and f"cluster {cid} is stopped" in done.stderr


def test_connection_fields_name_the_gateway(env: Env, exec_cluster: str) -> None:
    net = env.a.get(f"/v1/clusters/{exec_cluster}").json()["data"]["network"]["ssh_connection"]
    assert net["connection_string"] == f"ssh {exec_cluster}@127.0.0.1 -p {env.port}"
    assert net["gateway"] == net["connection_string"] and net["direct"] is None


@pytest.fixture(scope="module")
def sshd_cluster(env: Env, engine_url: str) -> str:
    build_slurm_image("podman", SLURM_IMAGE)
    cid = env.create(
        env.a,
        docker_image=SLURM_IMAGE,
        docker_args=SSHD_ARGS,
        env={"GPU_ENV": "via-sshd"},
        ports=[{"internal_port": 22, "external_port": 0, "protocol": "tcp"}],
    )
    data = wait_status(env.a, cid, {"running", "error"}, timeout=120)
    assert data["status"] == "running", (data.get("error_message"), data.get("last_exit"))
    wait_port(data["ports"][0]["external_port"])
    return cid


def test_sshd_path_scp_50mb_both_ways(env: Env, sshd_cluster: str, tmp_path: Path) -> None:
    cid = sshd_cluster
    src = tmp_path / "blob"
    src.write_bytes(os.urandom(50 * 1024 * 1024))
    digest = hashlib.sha256(src.read_bytes()).hexdigest()
    up = subprocess.run(
        [*ssh_argv(env.key_a, env.port, tool="scp"), str(src), f"{cid}@127.0.0.1:/root/blob"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert up.returncode == 0, up.stderr
    remote = ssh(env.key_a, env.port, cid, "sha256sum /root/blob")
    assert remote.stdout.split()[0] == digest, remote.stderr
    back = tmp_path / "back"
    down = subprocess.run(
        [*ssh_argv(env.key_a, env.port, tool="scp"), f"{cid}@127.0.0.1:/root/blob", str(back)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert down.returncode == 0, down.stderr
    assert hashlib.sha256(back.read_bytes()).hexdigest() == digest


def test_sshd_path_env_exit_codes_forwarding_and_direct(env: Env, sshd_cluster: str) -> None:
    cid = sshd_cluster
    assert ssh(env.key_a, env.port, cid, "exit 4").returncode == 4
    data = env.a.get(f"/v1/clusters/{cid}").json()["data"]
    conn = data["network"]["ssh_connection"]
    direct_port = data["ports"][0]["external_port"]
    assert conn["direct"] == f"ssh root@127.0.0.1 -p {direct_port}"
    assert conn["connection_string"] == f"ssh {cid}@127.0.0.1 -p {env.port}"
    # The account's key was written into root's authorized_keys: direct login works.
    direct = ssh(env.key_a, direct_port, "root", "echo direct")
    assert direct.stdout == "direct\n", direct.stderr
    # Other accounts' keys do not reach it directly either.
    assert ssh(env.key_b, direct_port, "root", "echo no").returncode == 255

    async def forward() -> bytes:
        async with asyncssh.connect(
            "127.0.0.1", env.port, username=cid, client_keys=[str(env.key_a)],
            known_hosts=None, agent_path=None, config=None,
        ) as conn:  # fmt: skip
            reader, writer = await conn.open_connection("127.0.0.1", 22, encoding=None)
            line: bytes = await asyncio.wait_for(reader.readline(), 10)
            writer.close()
            return line

    assert asyncio.run(forward()).startswith(b"SSH-2.0-OpenSSH")
    events = env.a.get(f"/v1/clusters/{cid}/events").json()["data"]["events"]
    assert any(e["type"] == "ssh_login" and "via sshd" in e["message"] for e in events)


def test_standalone_gateway_limits_failures_per_source(env: Env, exec_cluster: str) -> None:
    """``gpuyard ssh-gateway`` on its own, with a limit of 3 failed logins a minute:
    the 4th connection from the same address is refused even with the right key."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuyard", "ssh-gateway"],
        env={
            **os.environ,
            "GPUYARD_HOME": str(env.server.home),
            "GPUYARD_ENGINE_URL": env.server.engine_url,
            "GPUYARD_SSH_PORT": str(port),
            "GPUYARD_SSH_BIND": "127.0.0.1",
            "GPUYARD_SSH_AUTH_FAILURES_PER_MINUTE": "3",
        },
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        wait_port(port)
        assert ssh(env.key_a, port, exec_cluster, "echo ok").stdout == "ok\n"
        for _ in range(3):
            assert ssh(env.key_a2, port, exec_cluster, "true").returncode == 255
        blocked = ssh(env.key_a, port, exec_cluster, "echo ok", quiet=False)
        assert blocked.returncode == 255 and "too many failed logins" in blocked.stderr
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err.decode()[-2000:]
    logs = err.decode()
    assert "ssh login to" in logs and "AAAA" not in logs


def test_exec_path_sftp_uses_the_images_sftp_server(env: Env, tmp_path: Path) -> None:
    """No port 22, no sshd running, but the image has sftp-server: scp (SFTP) works
    through the exec path."""
    build_slurm_image("podman", SLURM_IMAGE)
    cid = env.create(env.a, docker_image=SLURM_IMAGE, docker_args="sleep infinity")
    assert wait_status(env.a, cid, {"running", "error"}, timeout=120)["status"] == "running"
    src = tmp_path / "blob"
    src.write_bytes(os.urandom(5 * 1024 * 1024))
    up = subprocess.run(
        [*ssh_argv(env.key_a, env.port, tool="scp"), str(src), f"{cid}@127.0.0.1:/root/blob"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert up.returncode == 0, up.stderr
    remote = ssh(env.key_a, env.port, cid, "sha256sum /root/blob")
    assert remote.stdout.split()[0] == hashlib.sha256(src.read_bytes()).hexdigest()


def test_a_dropped_exec_session_leaves_no_process_behind(env: Env, exec_cluster: str) -> None:
    """Engines keep an exec's process when its stream drops: the gateway hangs up
    what a session left running when the user goes away."""
    cid = exec_cluster
    client = subprocess.Popen(
        [*ssh_argv(env.key_a, env.port), f"{cid}@127.0.0.1", "sleep 4242"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while "sleep 4242" not in ssh(env.key_a, env.port, cid, "ps").stdout:
            assert time.monotonic() < deadline, "the command never started"
            time.sleep(0.3)
    finally:
        client.kill()
        client.wait()
    deadline = time.monotonic() + 20
    while "sleep 4242" in ssh(env.key_a, env.port, cid, "ps").stdout:
        assert time.monotonic() < deadline, "the dropped session's process still runs"
        time.sleep(0.3)


# -- a removed member's key stops opening the account's clusters ----------------------


def invited_member(env: Env, email: str, key: Path) -> tuple[httpx.Client, int]:
    """A user invited into account A as ``member`` through the API, with an SSH key
    of their own registered: their client and their membership id."""
    account_id = env.a.get("/v1/me").json()["data"]["acting"]["account_id"]
    r = env.a.post(
        f"/v1/accounts/{account_id}/invitations", json={"email": email, "role": "member"}
    )
    assert r.status_code == 201, r.text
    r = httpx.post(
        f"{env.server.url}/v1/invitations/{r.json()['data']['token']}/accept", verify=trusted_tls()
    )
    assert r.status_code == 201, r.text
    made = r.json()["data"]
    client = as_key(env.server, made["api_key"]["key"])
    r = client.post(
        "/v1/ssh-keys", json={"name": email, "public_key": key.with_suffix(".pub").read_text()}
    )
    assert r.status_code == 201, r.text
    return client, int(made["membership"]["id"])


def remove_member(env: Env, member_id: int) -> None:
    account_id = env.a.get("/v1/me").json()["data"]["acting"]["account_id"]
    r = env.a.delete(f"/v1/accounts/{account_id}/members/{member_id}")
    assert r.status_code == 200, r.text


def refused_within(key: Path, port: int, user: str, timeout_s: float = 60) -> str:
    """Poll logins until one is refused (fails after ``timeout_s``): its stderr."""
    deadline = time.monotonic() + timeout_s
    while True:
        done = ssh(key, port, user, "echo in", quiet=False)
        if done.returncode == 255 and done.stdout == "":
            return done.stderr
        assert time.monotonic() < deadline, f"still logs in: {done.stdout!r} {done.stderr!r}"
        time.sleep(0.3)


def test_a_removed_members_ssh_login_is_refused_within_seconds(
    env: Env, exec_cluster: str, tmp_path: Path
) -> None:
    cid = exec_cluster
    key = keygen(tmp_path / "carol")
    _, member_id = invited_member(env, "carol@example.com", key)
    assert ssh(key, env.port, cid, "echo in").stdout == "in\n"

    async def session_outlives_removal() -> bool:
        """A shell opened before the removal: True when the gateway ends it."""
        async with asyncssh.connect(
            "127.0.0.1", env.port, username=cid, client_keys=[str(key)],
            known_hosts=None, agent_path=None, config=None,
        ) as conn:  # fmt: skip
            proc = await conn.create_process("sleep 600")
            await asyncio.to_thread(remove_member, env, member_id)
            with contextlib.suppress(asyncssh.Error, OSError):
                await asyncio.wait_for(proc.wait(), 60)
            await asyncio.wait_for(conn.wait_closed(), 60)
            return True

    assert asyncio.run(session_outlives_removal())
    stderr = refused_within(key, env.port, cid)
    assert "may not log in" in stderr
    # The owner's key is untouched.
    assert ssh(env.key_a, env.port, cid, "echo owner").stdout == "owner\n"


def test_a_removed_members_key_leaves_the_clusters_sshd(
    env: Env, sshd_cluster: str, tmp_path: Path
) -> None:
    cid = sshd_cluster
    key = keygen(tmp_path / "dave")
    _, member_id = invited_member(env, "dave@example.com", key)
    direct_port = env.a.get(f"/v1/clusters/{cid}").json()["data"]["ports"][0]["external_port"]
    # The sync writes the new key within a pass: poll until direct login works.
    deadline = time.monotonic() + 60
    while ssh(key, direct_port, "root", "echo in").stdout != "in\n":
        assert time.monotonic() < deadline, "the member's key never reached the sshd"
        time.sleep(0.3)
    assert ssh(key, env.port, cid, "echo gw").stdout == "gw\n"
    remove_member(env, member_id)
    refused_within(key, direct_port, "root")
    refused_within(key, env.port, cid)
    assert ssh(env.key_a, direct_port, "root", "echo owner").stdout == "owner\n"


def test_a_removed_members_key_line_outside_the_block_is_deleted(
    env: Env, sshd_cluster: str, tmp_path: Path
) -> None:
    """An image's start script appends ``$PUBLIC_KEY`` outside gpuyard's block: once
    the member is removed, the sync deletes that line too (the direct login is
    refused), and keeps a line the user added that gpuyard does not know."""
    cid = sshd_cluster
    key = keygen(tmp_path / "erin")
    _, member_id = invited_member(env, "erin@example.com", key)
    direct_port = env.a.get(f"/v1/clusters/{cid}").json()["data"]["ports"][0]["external_port"]
    deadline = time.monotonic() + 60
    while ssh(key, direct_port, "root", "echo in").stdout != "in\n":
        assert time.monotonic() < deadline, "the member's key never reached the sshd"
        time.sleep(0.3)
    erins = key.with_suffix(".pub").read_text().split()
    users_own = keygen(tmp_path / "own").with_suffix(".pub").read_text().split()
    appended = f"{erins[0]} {erins[1]} appended-by-the-image\n{users_own[0]} {users_own[1]} own\n"
    done = ssh(env.key_a, direct_port, "root", f"printf '{appended}' >> /root/.ssh/authorized_keys")
    assert done.returncode == 0, done.stderr
    remove_member(env, member_id)
    refused_within(key, direct_port, "root")
    text = ssh(env.key_a, direct_port, "root", "cat /root/.ssh/authorized_keys").stdout
    assert erins[1] not in text and f"{users_own[1]} own" in text
