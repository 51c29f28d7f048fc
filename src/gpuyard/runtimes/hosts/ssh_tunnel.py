"""Reaching a host's container engine over SSH, with nothing of ours on the host.

The host's engine listens on a unix socket (Docker's or Podman's). OpenSSH forwards a
local unix socket to it (``ssh -N -L LOCAL.sock:REMOTE.sock``), and the docker SDK talks
to the local socket as to any local engine. The docker SDK's own ``ssh://`` transport
is not used: it runs ``docker system dial-stdio`` on the host, which Podman lacks.

The installation holds one client key (``$GPUYARD_HOME/ssh/id_ed25519``, made on first
use; its public half is what an operator adds to the host's ``authorized_keys``) and
its own ``known_hosts`` (trust on first use; a changed host key then fails, loudly).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shlex
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from gpuyard.core.errors import RuntimeFailure
from gpuyard.core.network.engine_address import EngineAddress, parse_engine_url
from gpuyard.runtimes.engines.url import ping_unix_socket, terminate_process
from gpuyard.runtimes.hosts.firewall import CommandResult

# Where a host's engine usually listens, most likely first (rootful Podman, Docker).
REMOTE_SOCKETS = ("/run/podman/podman.sock", "/var/run/docker.sock")
KEY_NAME = "id_ed25519"


class SshKeys:
    """The installation's SSH client key and known hosts, under ``home/ssh``."""

    def __init__(self, home: Path) -> None:
        self.dir = Path(home) / "ssh"
        self.key = self.dir / KEY_NAME
        self.known_hosts = self.dir / "known_hosts"
        self._lock = threading.Lock()

    def ensure(self) -> Path:
        """The private key's path, making the key pair on first use (mode 0600 in a
        0700 directory)."""
        with self._lock:
            self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(self.dir, 0o700)
            if not self.key.exists():
                if shutil.which("ssh-keygen") is None:
                    raise RuntimeFailure(
                        "ssh-keygen is not installed (apt-get install openssh-client)"
                    )
                done = subprocess.run(
                    ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gpuyard",
                     "-f", str(self.key)],
                    capture_output=True, text=True, timeout=30,
                )  # fmt: skip
                if done.returncode != 0:
                    raise RuntimeFailure(f"cannot make an SSH key: {done.stderr.strip()}")
            os.chmod(self.key, 0o600)
            self.known_hosts.touch(mode=0o600, exist_ok=True)
        return self.key

    def public_key(self) -> str:
        """The public key line an operator adds to a host's ``authorized_keys``."""
        self.ensure()
        return self.key.with_suffix(".pub").read_text().strip()

    def options(self, connect_timeout_s: float) -> list[str]:
        """OpenSSH options every connection of ours uses: our key only, no prompts,
        our known hosts, dead connections noticed within a few seconds."""
        self.ensure()
        return [
            "-i", str(self.key),
            "-o", "IdentitiesOnly=yes",
            "-o", "BatchMode=yes",
            "-o", f"UserKnownHostsFile={self.known_hosts}",
            "-o", "GlobalKnownHostsFile=/dev/null",
            "-o", "StrictHostKeyChecking=accept-new",
            "-o", f"ConnectTimeout={max(1, round(connect_timeout_s))}",
            "-o", "ServerAliveInterval=2",
            "-o", "ServerAliveCountMax=3",
            "-o", "LogLevel=ERROR",
        ]  # fmt: skip


def ssh_target(address: EngineAddress) -> list[str]:
    """``-p PORT user@host`` for ``address``."""
    assert address.host is not None
    return ["-p", str(address.port or 22), f"{address.user}@{address.host}"]


def explain(output: str, where: str, keys: SshKeys) -> str:
    """A message a user can act on for an ssh failure's output."""
    text = output.strip().splitlines()[-1] if output.strip() else "no output"
    if "Permission denied" in output:
        return (
            f"SSH to {where} refused our key: add the installation's public key "
            f"({keys.key}.pub, or `gpuyard hosts key`) to the host's authorized_keys"
        )
    if "REMOTE HOST IDENTIFICATION HAS CHANGED" in output or "Host key verification" in output:
        return (
            f"the SSH host key of {where} changed since it was first seen; if that is "
            f"expected, remove its line from {keys.known_hosts}"
        )
    return f"cannot reach the engine of {where} over SSH: {text[:300]}"


def start_ssh_child(
    argv: Sequence[str], log_path: Path, ready: Callable[[], bool], wait_s: float
) -> tuple[subprocess.Popen[bytes], bool]:
    """Start ``ssh`` (``argv``) and wait up to ``wait_s`` for ``ready()``: the child and
    whether it became ready. A child that exits meanwhile is returned at once, not
    ready (its ``poll()`` says so); one still running past the wait is the caller's to
    stop. Output goes to ``log_path``, never a pipe (a chatty child must not block on
    it); its own session, so a Ctrl-C aimed at the server does not reach it first."""
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return proc, False
        if ready():
            return proc, True
        time.sleep(0.05)
    return proc, False


class SshRunner:
    """Runs commands on a host over SSH; the runner type of runtimes/hosts/firewall.py."""

    def __init__(self, url: str, keys: SshKeys, timeout_s: float = 30.0) -> None:
        self.address = parse_engine_url(url)
        self.keys = keys
        self.timeout_s = timeout_s

    def __call__(self, argv: Sequence[str]) -> CommandResult:
        command = " ".join(shlex.quote(a) for a in argv)
        try:
            done = subprocess.run(
                ["ssh", *self.keys.options(min(self.timeout_s, 10)),
                 *ssh_target(self.address), command],
                capture_output=True, text=True, timeout=self.timeout_s, stdin=subprocess.DEVNULL,
            )  # fmt: skip
        except (OSError, subprocess.TimeoutExpired) as exc:
            return CommandResult(255, str(exc))
        return CommandResult(done.returncode, done.stdout + done.stderr)


class SshSocketTunnel:
    """A supervised ``ssh -N -L`` child forwarding a local unix socket (under
    ``local_dir``) to the host's engine socket. :meth:`url` (re)starts it when needed and
    answers the local ``unix://`` URL once the engine answers through it. Thread-safe."""

    def __init__(
        self,
        url: str,
        keys: SshKeys,
        local_dir: Path,
        *,
        connect_timeout_s: float = 10.0,
    ) -> None:
        self.address = parse_engine_url(url)
        if self.address.scheme != "ssh":
            raise ValueError("not an ssh:// engine URL")
        self.keys = keys
        self.where = f"{self.address.user}@{self.address.host}:{self.address.port or 22}"
        # Unix socket paths hold at most 107 bytes: a short name from the URL's hash.
        digest = hashlib.sha256(self.address.key.encode()).hexdigest()[:12]
        self.local_dir = Path(local_dir)
        self.local = self.local_dir / f"{digest}.sock"
        self.log_path = self.local_dir / f"{digest}.log"
        self.connect_timeout_s = connect_timeout_s
        self._remote: str | None = self.address.path or None
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    @property
    def local_url(self) -> str:
        return f"unix://{self.local}"

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def url(self) -> str:
        """The local URL of the host's engine, the tunnel started if it is not running.
        Raises RuntimeFailure with what to do when the host cannot be reached."""
        with self._lock:
            if self.alive() and ping_unix_socket(str(self.local), timeout_s=2.0):
                return self.local_url
            self._stop()
            self._start()
            return self.local_url

    def ensure(self, connect_timeout_s: float) -> None:
        """Start the tunnel if its ssh child is gone, giving the start about
        ``connect_timeout_s`` (a heartbeat: a host whose link is down is a miss within
        its timeout). A running child is left alone even when the engine behind it does
        not answer: a hung engine is not the tunnel's fault, and a silently dead link
        ends the child by itself (``ServerAliveInterval`` x ``ServerAliveCountMax``).
        Raises RuntimeFailure with what to do when the host cannot be reached."""
        with self._lock:
            if self.alive():
                return
            self._stop()
            self._start(connect_timeout_s)

    def remote_socket(self) -> str:
        """The engine socket on the host: the URL's path, else the first of the usual
        ones that exists there (asked once)."""
        if self._remote is None:
            tests = " || ".join(f"(test -S {p} && echo {p})" for p in REMOTE_SOCKETS)
            rootless = "$XDG_RUNTIME_DIR/podman/podman.sock"
            xdg = f"(test -S {rootless} && echo {rootless})"
            found = SshRunner(self._ssh_url(), self.keys, self.connect_timeout_s + 5)(
                ["sh", "-c", f"{tests} || {xdg}"]
            )
            path = found.output.strip().splitlines()[-1] if found.output.strip() else ""
            if found.returncode != 0 or not path.startswith("/"):
                if found.returncode == 255:
                    raise RuntimeFailure(explain(found.output, self.where, self.keys))
                raise RuntimeFailure(
                    f"no Docker or Podman socket found on {self.where} (looked at "
                    f"{', '.join(REMOTE_SOCKETS)}); name it in the URL: "
                    f"ssh://{self.where}/path/to/engine.sock"
                )
            self._remote = path
        return self._remote

    def _ssh_url(self) -> str:
        return f"ssh://{self.address.user}@{self.address.host}:{self.address.port or 22}"

    def _start(self, connect_timeout_s: float | None = None) -> None:
        connect = self.connect_timeout_s if connect_timeout_s is None else connect_timeout_s
        # How long the forwarded engine may take to answer once SSH is up.
        ready_s = connect + (5 if connect_timeout_s is None else connect)
        remote = self.remote_socket()
        self.local_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.local.unlink()
        argv = [
            "ssh", "-N", *self.keys.options(connect),
            "-o", "ExitOnForwardFailure=yes",
            "-o", "StreamLocalBindUnlink=yes",
            "-o", "StreamLocalBindMask=0177",
            "-L", f"{self.local}:{remote}",
            *ssh_target(self.address),
        ]  # fmt: skip
        self._proc, ready = start_ssh_child(
            argv,
            self.log_path,
            lambda: self.local.exists() and ping_unix_socket(str(self.local), timeout_s=2.0),
            ready_s,
        )
        if ready:
            return
        if self._proc.poll() is not None:
            self._proc = None
            raise RuntimeFailure(explain(self._log_tail(), self.where, self.keys))
        self._stop()
        raise RuntimeFailure(
            f"the engine of {self.where} did not answer through SSH within "
            f"{ready_s:.0f} s (socket {remote}); see {self.log_path}"
        )

    def _log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-2000:]
        return ""

    def _stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            terminate_process(proc, 5)
        with contextlib.suppress(FileNotFoundError):
            self.local.unlink()

    def close(self) -> None:
        with self._lock:
            self._stop()
