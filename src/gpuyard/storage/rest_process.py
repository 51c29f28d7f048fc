"""Starts and stops the REST backend server of one operation (storage/rest_server.py)
as a child process: the data plane stays out of the control plane's event loop and
threads, and the server's whole life is the operation's.

The child gets its configuration on stdin (the one-time credential and key never sit
on a command line or in the environment), and SIGTERM when the thread that started it
ends (so it deletes the locks it created and goes when the server dies). It is started
first (:meth:`RestServer.start`: Python's start-up overlaps the helper's), then told
where to listen (:meth:`RestServer.listen`): the helper's network namespace comes as a
file descriptor passed over a unix socket pair (``SCM_RIGHTS``), so no PID is looked
up twice. :meth:`RestServer.close` ends its stdin, which ends it; one that does not go
within a few seconds is killed.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import secrets
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Final

from gpuyard.core.errors import RuntimeFailure
from gpuyard.storage.child_process import Drain, die_with_parent, kill
from gpuyard.storage.rest_objects import LISTEN_HERE, LISTEN_IN, Mode

log = logging.getLogger(__name__)

# How long the child gets to say it listens, and to go once told to.
START_TIMEOUT_S: Final = 20.0
STOP_TIMEOUT_S: Final = 5.0
_MODULE: Final = "gpuyard.storage.rest_server"


class RestServerFailed(RuntimeFailure):
    """The REST backend server did not start (``details``: its last stderr lines)."""


class RestServer:
    """One operation's REST backend server for the repository at ``root`` (see the
    module docstring). Use as a context manager (started on entry, closed on exit), or
    call :meth:`start` and :meth:`close`; :meth:`listen` in between."""

    def __init__(self, root: Path, mode: Mode, keys: dict[str, bytes], *, port: int = 0) -> None:
        self.root = Path(root)
        self.mode = mode
        self.user = "gy-" + secrets.token_hex(4)
        self.password = secrets.token_urlsafe(32)
        self._keys = keys
        self._port = port
        self._control: socket.socket | None = None
        self.port: int | None = None
        self.locks_removed: list[str] = []
        self.exit_code: int | None = None  # the child's, once closed
        self._proc: subprocess.Popen[bytes] | None = None
        self._err: Drain | None = None

    def url(self, host: str = "127.0.0.1") -> str:
        """The repository as restic names it: ``rest:http://user:password@host:port/``."""
        if self.port is None:
            raise RuntimeError("the server is not started")
        return f"rest:http://{self.user}:{self.password}@{host}:{self.port}/"

    def start(self) -> None:
        """Start the child (it then waits for :meth:`listen`). Raises RestServerFailed."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self._control = ours
        config = {
            "root": str(self.root),
            "user": self.user,
            "password": self.password,
            "mode": self.mode.value,
            "keys": {k: base64.b64encode(v).decode() for k, v in self._keys.items()},
            "port": self._port,
            "control_fd": theirs.fileno(),
        }
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", _MODULE],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=(theirs.fileno(),),
                preexec_fn=die_with_parent(signal.SIGTERM),
                env=_child_environment(),
            )
        except (OSError, subprocess.SubprocessError) as exc:
            ours.close()
            self._control = None
            raise RestServerFailed(f"the REST backend server did not start: {exc}") from exc
        finally:
            theirs.close()
        assert self._proc.stdin is not None and self._proc.stdout is not None
        assert self._proc.stderr is not None
        self._err = Drain(self._proc.stderr)
        try:
            self._proc.stdin.write(json.dumps(config).encode() + b"\n")
            self._proc.stdin.flush()
        except OSError as exc:
            self._fail(f"the REST backend server did not start: {exc}")

    def listen(self, netns_fd: int | None) -> None:
        """Have the started child listen on ``127.0.0.1`` in the network namespace open
        on ``netns_fd`` (the helper's; None: this process's own, for tests), and wait
        until it does. Raises RestServerFailed."""
        assert self._proc is not None and self._proc.stdout is not None
        assert self._control is not None
        try:
            if netns_fd is None:
                socket.send_fds(self._control, [LISTEN_HERE], [])
            else:
                socket.send_fds(self._control, [LISTEN_IN], [netns_fd])
            line = _read_line(self._proc.stdout, START_TIMEOUT_S)
        except (OSError, TimeoutError) as exc:
            self._fail(f"the REST backend server did not start: {exc}")
        if not line.startswith(b"listening "):
            self._fail("the REST backend server did not start")
        self.port = int(line.split()[1])

    @property
    def pid(self) -> int | None:
        """The child's process id while it runs (None before start and once closed)."""
        return self._proc.pid if self._proc is not None else None

    def serving(self) -> bool:
        """Whether the child is still there (it ends only when closed, or killed)."""
        return self._proc is not None and self._proc.poll() is None

    def _fail(self, message: str) -> None:
        assert self._proc is not None and self._err is not None
        kill(self._proc)
        stderr = self._err.text()
        raise RestServerFailed(message, {"stderr": stderr[-2000:]})

    def close(self) -> None:
        """End the operation: the server stops answering, deletes the locks it made
        that restic left, and exits (killed after STOP_TIMEOUT_S). Idempotent."""
        proc, self._proc = self._proc, None
        if self._control is not None:
            self._control.close()
            self._control = None
        if proc is None:
            return
        assert proc.stdin is not None and proc.stdout is not None
        with contextlib.suppress(OSError):
            proc.stdin.close()
        try:
            self.exit_code = proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            log.warning("REST backend server %d did not stop; killed", proc.pid)
            kill(proc)
            self.exit_code = proc.returncode
        with contextlib.suppress(OSError, ValueError):
            for line in proc.stdout.read().splitlines():
                if line.startswith(b"{"):
                    self.locks_removed = list(json.loads(line).get("locks_removed") or [])
        proc.stdout.close()
        if self._err is not None:
            self._err.join()
        if self.locks_removed:
            log.info("REST backend server removed %d locks left behind", len(self.locks_removed))

    def __enter__(self) -> RestServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _child_environment() -> dict[str, str]:
    """The child's environment: this one's, so it imports gpuyard the same way."""
    return dict(os.environ)


def _read_line(pipe: object, timeout_s: float) -> bytes:
    """One line from the child's stdout, within ``timeout_s`` (TimeoutError)."""
    fd = pipe.fileno()  # type: ignore[attr-defined]
    deadline = time.monotonic() + timeout_s
    buf = b""
    while b"\n" not in buf:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no answer within {timeout_s:.0f} s")
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        buf += chunk
    return buf.split(b"\n", 1)[0]
