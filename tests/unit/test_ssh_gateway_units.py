"""The SSH gateway's pure parts: the failed-login limiter, key matching, published
ports, the managed ``authorized_keys`` block, the gateway's own keys and its
advertised endpoint."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import asyncssh

from gpuyard.edge.auth_limiter import FailureLimiter
from gpuyard.edge.gateway_keys import host_key, public_line, upstream_key
from gpuyard.edge.ssh_directory import AccountKey, key_blob, match_key, published_ssh_port
from gpuyard.edge.ssh_service import GatewaySupervisor
from gpuyard.edge.ssh_upstream import (
    AUTHORIZED_KEYS_SCRIPT,
    BEGIN,
    END,
    managed_block,
    sync_input,
)
from gpuyard.settings import Settings


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_limiter_blocks_after_the_limit_until_a_failure_has_refilled() -> None:
    clock = Clock()
    limiter = FailureLimiter(3, 60.0, clock=clock)
    for _ in range(2):
        limiter.failed("10.0.0.1")
        clock.t += 1
    assert not limiter.blocked("10.0.0.1")
    limiter.failed("10.0.0.1")
    assert limiter.blocked("10.0.0.1")
    # Other sources are not affected.
    assert not limiter.blocked("10.0.0.2")
    # The allowance refills at 3 a minute (one every 20 s); 0.1 of it refilled in the
    # 2 s the failures took, so one more try comes 18 s later, and only one.
    assert 17.9 < limiter.blocked_for("10.0.0.1") <= 18.0
    clock.t += 18.01
    assert not limiter.blocked("10.0.0.1")
    limiter.failed("10.0.0.1")
    assert limiter.blocked("10.0.0.1")
    # A minute unused makes the allowance whole: the source is forgotten.
    clock.t += 61
    assert not limiter.blocked("10.0.0.1")
    for _ in range(2):
        limiter.failed("10.0.0.1")
    assert not limiter.blocked("10.0.0.1")


def test_limiter_counts_failures_while_blocked() -> None:
    clock = Clock()
    limiter = FailureLimiter(2, 60.0, clock=clock)
    limiter.failed("a")
    limiter.failed("a")
    clock.t += 50
    # Tries while blocked count: a source that keeps trying stays blocked.
    limiter.failed("a")
    clock.t += 5
    limiter.failed("a")
    clock.t += 15
    assert limiter.blocked("a")
    clock.t += 41
    assert not limiter.blocked("a")


def test_limiter_off_and_bounded() -> None:
    off = FailureLimiter(0)
    for _ in range(100):
        off.failed("a")
    assert not off.blocked("a") and len(off) == 0
    small = FailureLimiter(1, max_tracked=3)
    for i in range(10):
        small.failed(f"10.0.0.{i}")
    assert len(small) == 3
    assert small.blocked("10.0.0.9") and not small.blocked("10.0.0.0")


def _key() -> asyncssh.SSHKey:
    return asyncssh.generate_private_key("ssh-ed25519")


def test_keys_match_by_their_data_only() -> None:
    mine, other = _key(), _key()
    line = mine.export_public_key().decode().strip() + " laptop"
    blob = key_blob(line)
    assert blob == mine.public_data
    keys = [AccountKey(1, "laptop", "SHA256:x", blob or b"")]
    assert match_key(mine.public_data, keys) == keys[0]
    assert match_key(other.public_data, keys) is None
    assert match_key(mine.public_data, []) is None
    assert key_blob("ssh-ed25519") is None and key_blob("ssh-ed25519 !!notbase64") is None


def test_published_ssh_port() -> None:
    assert published_ssh_port([]) is None
    assert published_ssh_port([{"internal_port": 22, "protocol": "tcp", "host_port": 20005}]) == (
        20005
    )
    assert published_ssh_port([{"internal_port": 22, "protocol": "udp", "host_port": 1}]) is None
    assert published_ssh_port([{"internal_port": 8888, "protocol": "http", "host_port": 2}]) is None
    assert published_ssh_port([{"internal_port": 22, "protocol": "tcp", "host_port": 0}]) is None


def test_managed_block_holds_one_key_per_line() -> None:
    block = managed_block(["ssh-ed25519 AAAA a", "", "  ssh-rsa BBBB b  ", "bad\ninjected"])
    assert block.decode().splitlines() == [BEGIN, "ssh-ed25519 AAAA a", "ssh-rsa BBBB b", END]


def run_sync_script(home: Path, lines: list[str], drop: set[str]) -> list[str]:
    """The sync script run by this machine's sh on ``home`` in place of /root."""
    script = AUTHORIZED_KEYS_SCRIPT.replace("/root/.ssh", str(home / ".ssh"))
    done = subprocess.run(
        ["/bin/sh", "-c", script], input=sync_input(lines, drop), capture_output=True, check=False
    )
    assert done.returncode == 0, done.stderr
    return (home / ".ssh" / "authorized_keys").read_text().splitlines()


def test_the_sync_drops_gpuyards_revoked_keys_anywhere_and_keeps_the_users(
    tmp_path: Path,
) -> None:
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "authorized_keys").write_text(
        "ssh-ed25519 AAAAgone carol-appended-by-the-image\n"
        "ssh-ed25519 AAAAmine the-users-own\n"
        'from="10.0.0.1" ssh-ed25519 AAAAgone carol-with-options\n'
        f"{BEGIN}\nssh-ed25519 AAAAgone old-block\n{END}\n"
        "ssh-ed25519 AAAAkept alice-appended-by-the-image\n"
    )
    after = run_sync_script(
        tmp_path,
        ["ssh-ed25519 AAAAkept alice"],
        # A body of the lines is never dropped; what is not base64 is not passed on.
        {"AAAAgone", "AAAAkept", "x' ; touch pwned ; '", "a b"},
    )
    assert after == [
        "ssh-ed25519 AAAAmine the-users-own",
        "ssh-ed25519 AAAAkept alice-appended-by-the-image",
        BEGIN,
        "ssh-ed25519 AAAAkept alice",
        END,
    ]
    assert not (tmp_path / "pwned").exists()
    assert sync_input([], {"a b", "ok+/=", "bad\n-x"}).decode().splitlines()[0] == "-ok+/="
    # Again: idempotent; nothing to drop keeps every line.
    assert run_sync_script(tmp_path, ["ssh-ed25519 AAAAkept alice"], set()) == after


def test_gateway_keys_are_made_once_and_private(tmp_path: Path) -> None:
    first = host_key(tmp_path)
    again = host_key(tmp_path)
    assert public_line(first) == public_line(again)
    assert public_line(upstream_key(tmp_path)) != public_line(first)
    path = tmp_path / "ssh-gateway" / "host_ed25519"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700


def test_gateway_endpoint_setting(tmp_path: Path) -> None:
    assert Settings(home=tmp_path).ssh_gateway_endpoint == ("127.0.0.1", 2222)
    assert Settings(home=tmp_path, host="0.0.0.0").ssh_gateway_endpoint == ("127.0.0.1", 2222)
    assert Settings(home=tmp_path, public_address="gpu.example.com").ssh_gateway_endpoint == (
        "gpu.example.com",
        2222,
    )
    named = Settings(home=tmp_path, ssh_host="ssh.example.com", ssh_port=22)
    assert named.ssh_gateway_endpoint == ("ssh.example.com", 22)
    assert Settings(home=tmp_path, ssh_port=0).ssh_gateway_endpoint is None
    assert Settings(home=tmp_path, ssh_enabled=False).ssh_gateway_endpoint is None


def test_supervisor_restarts_a_dead_gateway_and_stops_it() -> None:
    quick = GatewaySupervisor(
        None,
        argv=[sys.executable, "-c", "pass"],
        backoff_initial_s=0.05,
        backoff_max_s=0.1,
    )
    quick.start()
    deadline = time.monotonic() + 10
    while quick.restarts < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    quick.stop()
    assert quick.restarts >= 2 and quick.pid is None

    lasting = GatewaySupervisor(None, argv=[sys.executable, "-c", "import time; time.sleep(60)"])
    lasting.start()
    pid = lasting.pid
    assert pid is not None
    lasting.stop(timeout_s=5)
    assert lasting.pid is None and lasting.restarts == 0
    # The child is gone (reaped), not left running.
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text()
