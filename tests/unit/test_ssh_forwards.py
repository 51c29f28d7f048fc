"""Forwards to ssh:// hosts' loopback ports (runtimes/hosts/ssh_forwards.py) when the host
cannot be reached: the proxy's sync pass gets the socket's address at once, and a dead
host is not dialled again on every pass. (A reachable host: tests/e2e/
test_private_ports_e2e.py, through a real sshd.)"""

from __future__ import annotations

from pathlib import Path

from gpuyard.runtimes.hosts.ssh_forwards import SshPortForwards
from gpuyard.runtimes.hosts.ssh_tunnel import SshKeys
from tests.required_parts import needs_tools

pytestmark = needs_tools("ssh", "ssh-keygen", how="apt-get install openssh-client")

# Nothing listens on port 1 of loopback: every connection is refused at once.
DEAD = "ssh://root@127.0.0.1:1"


def test_an_unreachable_host_is_not_dialled_on_every_pass(tmp_path: Path) -> None:
    forwards = SshPortForwards(SshKeys(tmp_path), tmp_path / "fwd", connect_timeout_s=2)
    try:
        first = forwards.upstream(DEAD, 20000)
        assert first == f"unix/{forwards.socket(DEAD, 20000)}"
        assert forwards.upstream(DEAD, 20000) == first  # the same address, stable
        assert forwards.upstream(DEAD, 20001).endswith("-20001.sock")
        logs = list((tmp_path / "fwd").glob("*.log"))
        assert len(logs) == 1
        # One attempt, however many calls came within the retry delay.
        assert logs[0].read_text().count("Connection refused") == 1
        forwards.retain(set())
    finally:
        forwards.close()
