"""Reaching a remote host's loopback ports from this machine over SSH.

A private http port is published on its host's loopback only (runtimes/base.py
PortBinding), out of reach of every other host and container. The HTTP proxy, on this
machine, reaches such a port of a host added as ``ssh://`` through a forward: a local
unix socket (mode 0600, in a 0700 directory) that OpenSSH forwards to ``127.0.0.1:PORT``
on the host. Caddy dials the socket (``unix//PATH``).

Each host gets one OpenSSH control master (``ssh -N -M``, the installation's key and
known hosts, runtimes/hosts/ssh_tunnel.py); forwards are added to it and cancelled on it
(``ssh -O forward`` / ``-O cancel``), so adding or removing one port never cuts the
connections of another. A master that died (the host rebooted, the network broke) is
started again, its forwards with it, at the next :meth:`SshPortForwards.upstream` call
(a host that could not be reached is tried again after ``RETRY_AFTER_S``).
The socket's path depends only on the host's URL and the port, so the proxy's
configuration does not change when a master restarts.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from gpuyard.core.network.engine_address import parse_engine_url
from gpuyard.runtimes.engines.url import terminate_process
from gpuyard.runtimes.hosts.ssh_tunnel import SshKeys, ssh_target, start_ssh_child

log = logging.getLogger(__name__)


# After a host could not be reached, it is not tried again for this long: the proxy's
# sync pass (which sets forwards up) must not wait on a dead host every time it runs.
RETRY_AFTER_S = 30.0


class _Waiting(Exception):
    """The host failed recently: not tried again yet."""


@dataclass
class _Master:
    url: str
    control: Path
    proc: subprocess.Popen[bytes] | None = None
    ports: set[int] = field(default_factory=set)
    # monotonic time before which a failed host is not tried again
    retry_at: float = 0.0


class SshPortForwards:
    """Forwards to hosts' loopback ports, under ``directory``. Thread-safe."""

    def __init__(self, keys: SshKeys, directory: Path, *, connect_timeout_s: float = 10.0):
        self.keys = keys
        self.dir = Path(directory)
        self.connect_timeout_s = connect_timeout_s
        self._lock = threading.Lock()
        self._masters: dict[str, _Master] = {}

    def _stem(self, url: str) -> str:
        # Unix socket paths hold at most 107 bytes: a short name from the URL's key.
        return hashlib.sha256(parse_engine_url(url).key.encode()).hexdigest()[:10]

    def socket(self, url: str, port: int) -> Path:
        """Where port ``port`` of the host at ``url`` is reached (whether or not the
        forward is up)."""
        return self.dir / f"{self._stem(url)}-{port}.sock"

    def upstream(self, url: str, port: int) -> str:
        """The proxy's dial address of ``127.0.0.1:port`` on the ssh:// host ``url``,
        the forward set up when it is not. Never raises: a host that cannot be reached
        now is logged, and its address answers nothing until a later call succeeds."""
        path = self.socket(url, port)
        try:
            with self._lock:
                self._ensure(url, port)
        except _Waiting:
            pass  # failed a moment ago (logged then)
        except (OSError, subprocess.SubprocessError, RuntimeError) as exc:
            log.warning("no forward to port %s of %s yet: %s", port, url, exc)
        return f"unix/{path}"

    def retain(self, wanted: set[tuple[str, int]]) -> None:
        """Cancel every forward not in ``wanted`` (``(url, port)`` pairs); a host left
        with none has its master stopped."""
        with self._lock:
            for url, master in list(self._masters.items()):
                for port in sorted(master.ports - {p for u, p in wanted if u == url}):
                    self._control(master, "cancel", port)
                    master.ports.discard(port)
                    with contextlib.suppress(FileNotFoundError):
                        self.socket(url, port).unlink()
                if not master.ports:
                    self._stop(master)
                    del self._masters[url]

    def close(self) -> None:
        with self._lock:
            for master in self._masters.values():
                self._stop(master)
            self._masters.clear()

    # -- the masters --------------------------------------------------------------------

    def _ensure(self, url: str, port: int) -> None:
        master = self._masters.get(url)
        if master is None:
            master = self._masters[url] = _Master(url, self.dir / f"{self._stem(url)}.ctl")
        if master.proc is None or master.proc.poll() is not None:
            if time.monotonic() < master.retry_at:
                raise _Waiting()
            try:
                self._start(master)
            except (OSError, subprocess.SubprocessError, RuntimeError):
                master.retry_at = time.monotonic() + RETRY_AFTER_S
                raise
        if port not in master.ports:
            done = self._control(master, "forward", port)
            if done.returncode != 0:
                raise RuntimeError(done.stdout.decode(errors="replace").strip()[-300:])
            master.ports.add(port)

    def _start(self, master: _Master) -> None:
        self._stop(master)
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            master.control.unlink()
        argv = [
            "ssh", "-N", "-M", "-S", str(master.control),
            *self.keys.options(self.connect_timeout_s),
            "-o", "ControlPersist=no",
            "-o", "StreamLocalBindUnlink=yes",
            "-o", "StreamLocalBindMask=0177",
            *ssh_target(parse_engine_url(master.url)),
        ]  # fmt: skip
        log_path = master.control.with_suffix(".log")
        master.proc, ready = start_ssh_child(
            argv,
            log_path,
            lambda: master.control.exists() and self._check(master),
            self.connect_timeout_s + 5,
        )
        if ready:
            return
        if master.proc.poll() is not None:
            master.proc = None
            raise RuntimeError(f"ssh to the host failed; see {log_path}")
        self._stop(master)
        raise RuntimeError(f"ssh to the host did not connect in time; see {log_path}")

    def _ssh_control(self, master: _Master, *args: str) -> subprocess.CompletedProcess[bytes]:
        argv = [
            "ssh", "-S", str(master.control), *self.keys.options(self.connect_timeout_s),
            *args, *ssh_target(parse_engine_url(master.url)),
        ]  # fmt: skip
        return subprocess.run(
            argv, stdin=subprocess.DEVNULL, capture_output=False, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, timeout=self.connect_timeout_s + 5, check=False,
        )  # fmt: skip

    def _check(self, master: _Master) -> bool:
        return self._ssh_control(master, "-O", "check").returncode == 0

    def _control(
        self, master: _Master, operation: str, port: int
    ) -> subprocess.CompletedProcess[bytes]:
        spec = f"{self.socket(master.url, port)}:127.0.0.1:{port}"
        return self._ssh_control(master, "-O", operation, "-L", spec)

    def _stop(self, master: _Master) -> None:
        proc, master.proc = master.proc, None
        master.ports.clear()
        if proc is not None:
            terminate_process(proc, 5)
        with contextlib.suppress(FileNotFoundError):
            master.control.unlink()
