"""``gpuyard serve`` for the end-to-end tests, forked from a process that has already
imported it.

A server started as ``python -m gpuyard serve`` spends seconds of CPU importing
gpuyard before it listens (on a loaded two-core machine, most of its start), and the
end-to-end tests start about a hundred. A launcher (this module run as
``python -m tests.e2e.serve_launcher SOCKET``, one per test process, started on first
use) imports the server's code once and forks a child per server: the child sets the
environment, working directory and log it was asked for and runs the same CLI entry
point ``python -m gpuyard serve`` runs. It is the real server, in a process of its own.

Not for a server whose behaviour is fixed at import: the crash points read
``GPUYARD_CRASH_AT`` when their module is imported (observability/crash_points.py),
so such a server is started as a plain subprocess (:func:`can_fork`).

The launcher answers one JSON line per connection on a unix socket:
``{"op": "serve", "env": {...}, "cwd": ..., "log": ...}`` → ``{"pid": N}``, and
``{"op": "reap", "pid": N}`` → ``{"rc": ...}`` (``Popen.returncode``'s meaning). It
reaps a child only when asked, so a server's pid is never reused while the test holds
it; the test learns that the server ended from a pidfd (:class:`ForkedServer`).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
# The environment variable whose presence means "start this server as a subprocess".
IMPORT_TIME_ENV = ("GPUYARD_CRASH_AT",)
# Set to 0 to start every test server as a plain subprocess.
FORK_ENV = "GPUYARD_E2E_FORK"
_PR_SET_PDEATHSIG = 1


def can_fork(env: dict[str, str]) -> bool:
    """Whether a server with ``env`` may be forked from the launcher (nothing in it is
    read at import time, and forking is not turned off)."""
    return os.environ.get(FORK_ENV, "1") != "0" and not any(k in env for k in IMPORT_TIME_ENV)


class ForkedServer:
    """A server the launcher forked, with the part of ``subprocess.Popen``'s interface
    the tests use (``pid``, ``poll``, ``wait``, ``send_signal``, ``kill``,
    ``returncode``)."""

    def __init__(self, launcher: Launcher, pid: int) -> None:
        self.launcher, self.pid = launcher, pid
        # The child stays a zombie of the launcher until reaped (on our request): the
        # pid cannot name another process while this is open.
        self._pidfd: int | None = os.pidfd_open(pid)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and self._pidfd is not None:
            ready, _, _ = select.select([self._pidfd], [], [], 0)
            if ready:
                self._reap()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None and self._pidfd is not None:
            ready, _, _ = select.select([self._pidfd], [], [], timeout)
            if not ready:
                raise subprocess.TimeoutExpired(["gpuyard", "serve"], timeout or 0)
            self._reap()
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def _reap(self) -> None:
        self.returncode = int(self.launcher.ask({"op": "reap", "pid": self.pid})["rc"])
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None


class Launcher:
    """The test process's side: starts the launcher on first use, asks it for servers,
    and ends it when the test process exits."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._socket: Path | None = None

    def serve(self, env: dict[str, str], log: Path) -> ForkedServer:
        """Fork a ``gpuyard serve`` with exactly ``env``, in the repository root, its
        output appended to ``log``."""
        reply = self.ask({"op": "serve", "env": env, "cwd": str(ROOT), "log": str(log)})
        return ForkedServer(self, int(reply["pid"]))

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        path = self._started()
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(120)
            s.connect(str(path))
            s.sendall(json.dumps(request).encode() + b"\n")
            line = s.makefile("rb").readline()
        if not line:
            raise RuntimeError(f"the server launcher gave no answer to {request['op']}")
        answer: dict[str, Any] = json.loads(line)
        if "error" in answer:
            raise RuntimeError(f"the server launcher: {answer['error']}")
        return answer

    def _started(self) -> Path:
        with self._lock:
            if self._proc is not None and self._proc.poll() is None and self._socket:
                return self._socket
            if self._proc is None:
                atexit.register(self._stop)
            else:  # the launcher died: its folder goes before a new one is made
                self._stop()
            work = Path(tempfile.mkdtemp(prefix="gy-launch-"))
            self._socket = work / "launcher.sock"
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "tests.e2e.serve_launcher", str(self._socket)],
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
            )
            deadline = time.monotonic() + 120
            while not self._socket.exists():
                if self._proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the server launcher did not start")
                time.sleep(0.05)
            return self._socket

    def _stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=10)
        if self._socket is not None:
            shutil.rmtree(self._socket.parent, ignore_errors=True)


LAUNCHER = Launcher()


# -- the launcher process ---------------------------------------------------------------


def _serve_child(request: dict[str, Any]) -> None:
    """In the forked child: become the server that was asked for; never returns."""
    code = 1
    try:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        log = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.close(null)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        tempfile.tempdir = None  # TMPDIR is read again, from the server's environment
        sys.argv = [sys.executable, "-m", "gpuyard", "serve"]
        from gpuyard.cli.main import cli

        try:
            cli(["serve"], prog_name="gpuyard")
            code = 0
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _answer(conn: socket.socket, server: socket.socket) -> None:
    line = conn.makefile("rb").readline()
    request: dict[str, Any] = json.loads(line)
    if request["op"] == "serve":
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            conn.close()
            server.close()
            _serve_child(request)
        conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
    elif request["op"] == "reap":
        _, status = os.waitpid(int(request["pid"]), 0)
        conn.sendall(json.dumps({"rc": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
    else:
        conn.sendall(json.dumps({"error": f"unknown op {request['op']!r}"}).encode() + b"\n")


def main(socket_path: str) -> None:
    # Ends with the test process that started it, however that one ends.
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    parent = os.getppid()
    # What a server's start would import: done once, here.
    import gpuyard.cli.main
    import gpuyard.cli.serve  # noqa: F401

    path = Path(socket_path)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(path.with_suffix(".tmp")))
        server.listen(64)
        # Present under its name only once it listens (the test process waits on it).
        os.rename(path.with_suffix(".tmp"), path)
        server.settimeout(1.0)
        while os.getppid() == parent:
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(None)
                try:
                    _answer(conn, server)
                except (OSError, ValueError, KeyError) as exc:
                    with contextlib.suppress(OSError):
                        conn.sendall(json.dumps({"error": str(exc)}).encode() + b"\n")


if __name__ == "__main__":
    main(sys.argv[1])
