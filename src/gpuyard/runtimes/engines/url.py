"""Find a container engine to talk to, or start Podman's Docker-compatible service.

``detect_engine_url`` only looks (it never starts anything); ``PodmanService`` owns a
``podman system service`` child process for machines where Podman is installed but no
engine socket is listening (the common case on CI and fresh hosts: Podman is daemonless
and its socket is normally started by systemd, which containers and CI often lack).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import stat
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

from gpuyard.core.errors import RuntimeFailure

ROOT_PODMAN_SOCKET = "/run/podman/podman.sock"
DOCKER_SOCKET = "/var/run/docker.sock"


def candidate_sockets(env: Mapping[str, str] | None = None) -> list[str]:
    """Well-known engine socket paths, most preferred first."""
    env = os.environ if env is None else env
    paths = [ROOT_PODMAN_SOCKET, DOCKER_SOCKET]
    xdg = env.get("XDG_RUNTIME_DIR")
    if xdg:
        paths.append(os.path.join(xdg, "podman", "podman.sock"))
    return paths


def detect_engine_url(explicit: str | None, env: Mapping[str, str] | None = None) -> str | None:
    """The engine URL to use, or None when none is configured or found.

    Order: ``explicit`` (e.g. from settings) wins; then ``DOCKER_HOST``; then the first
    existing socket among :func:`candidate_sockets`. Existence is checked, not liveness:
    a stale socket is reported by ``Runtime.available()``.
    """
    if explicit:
        return explicit
    env = os.environ if env is None else env
    docker_host = env.get("DOCKER_HOST")
    if docker_host:
        return docker_host
    for path in candidate_sockets(env):
        if _is_socket(path):
            return f"unix://{path}"
    return None


def is_local_engine(url: str | None) -> bool:
    """Whether ``url`` reaches an engine on this machine (a unix socket), so this
    machine's firewall is the engine host's (runtimes/hosts/firewall.py). None: the SDK's
    default, ``DOCKER_HOST`` or the local socket."""
    if url is None:
        url = os.environ.get("DOCKER_HOST") or "unix://"
    return url.startswith("unix://")


def _is_socket(path: str) -> bool:
    try:
        return stat.S_ISSOCK(os.stat(path).st_mode)
    except OSError:
        return False


def ping_unix_socket(path: str, timeout_s: float = 1.0) -> bool:
    """True when an Engine API server answers ``GET /_ping`` with 200 on ``path``.

    Raw HTTP over the socket keeps this free of the docker SDK, so it is cheap to poll.
    """
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout_s)
            s.connect(path)
            s.sendall(b"GET /_ping HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            head = s.recv(64)
        return head.startswith(b"HTTP/1.") and b" 200 " in head
    except OSError:
        return False


def default_service_socket(home: str | os.PathLike[str] | None) -> Path:
    """Where a service started by gpuyard listens: the standard rootful Podman path when
    running as root without a home, else ``<home>/podman.sock``."""
    if home is not None:
        return Path(home) / "podman.sock"
    if os.geteuid() == 0:
        return Path(ROOT_PODMAN_SOCKET)
    xdg = os.environ.get("XDG_RUNTIME_DIR") or f"/tmp/gpuyard-{os.geteuid()}"
    return Path(xdg) / "podman" / "podman.sock"


def terminate_process(proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    """SIGTERM, then SIGKILL after ``timeout_s``; always reaps the child (no zombie)."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class PodmanService:
    """A ``podman system service --time=0`` child process listening on ``socket_path``.

    ``start()`` is idempotent and returns the ``unix://`` URL once the socket answers a
    ping; ``stop()`` terminates (then kills) the child and reaps it, so no zombie is left.
    Usable as a context manager.
    """

    def __init__(
        self,
        socket_path: str | os.PathLike[str],
        podman: str = "podman",
        ready_timeout_s: float = 10.0,
    ) -> None:
        self.socket_path = Path(socket_path)
        self._podman = podman
        self._ready_timeout_s = ready_timeout_s
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"unix://{self.socket_path}"

    @staticmethod
    def podman_installed(podman: str = "podman") -> bool:
        return shutil.which(podman) is not None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> str:
        """Start the service (if not already started by us) and wait until it answers.

        Raises :class:`RuntimeFailure` when podman is missing, the process exits early,
        or the socket does not answer within ``ready_timeout_s``.
        """
        if self.running:
            return self.url
        exe = shutil.which(self._podman)
        if exe is None:
            raise RuntimeFailure(
                "podman is not installed: install it (apt-get install podman) or Docker, "
                "or point gpuyard at a running engine with DOCKER_HOST"
            )
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        if self.socket_path.exists():
            if ping_unix_socket(str(self.socket_path)):
                # A service that outlived the server that started it (a SIGKILL gives
                # no chance to stop it): adopted, not doubled (a second one could not
                # bind the socket). It is not ours to stop.
                return self.url
            # A socket file left by a crashed service would make bind() fail.
            with contextlib.suppress(OSError):
                self.socket_path.unlink()
        # Output goes to a file, not a pipe, so a chatty service can never block on a full
        # pipe; new session so a Ctrl-C aimed at the server does not hit podman first.
        log_path = self.socket_path.with_suffix(".log")
        with open(log_path, "ab") as log:
            self._proc = subprocess.Popen(
                [exe, "system", "service", "--time=0", self.url],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        deadline = time.monotonic() + self._ready_timeout_s
        while time.monotonic() < deadline:
            if ping_unix_socket(str(self.socket_path), timeout_s=0.5):
                return self.url
            if self._proc.poll() is not None:
                code = self._proc.returncode
                self._proc = None
                raise RuntimeFailure(
                    f"podman system service exited with code {code}; see {log_path}"
                )
            time.sleep(0.05)
        self.stop()
        raise RuntimeFailure(
            f"podman system service did not answer on {self.socket_path} within "
            f"{self._ready_timeout_s:.0f} s; see {log_path}"
        )

    def stop(self, timeout_s: float = 5.0) -> None:
        """Terminate the child, kill it if it lingers, and reap it. Idempotent."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        terminate_process(proc, timeout_s)
        with contextlib.suppress(OSError):
            self.socket_path.unlink()

    def __enter__(self) -> PodmanService:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
