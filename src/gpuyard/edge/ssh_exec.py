"""The gateway's exec path: a user's session channel becomes a process started through
the engine's exec API (edge/exec_pty.py), for clusters without an sshd.

- a shell (``ssh CLUSTER@HOST``): a login shell (bash where present) on a pty;
- a command (``ssh CLUSTER@HOST 'cmd'``): ``/bin/sh -c cmd``, on a pty only when the
  client asked for one (``-t``), so stdout and stderr stay apart otherwise;
- window changes resize the pty; the process's exit code is the session's;
- subsystems (sftp) are not offered here: they need an sshd in the image;
- engines keep an exec's process running when its stream is dropped, so a session
  that ends before its process does (the user went away) has every process carrying
  its marker (``GPUYARD_EXEC`` in the environment, inherited by children) hung up
  through a second exec.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import ssl
from collections.abc import Mapping

import asyncssh

from gpuyard.edge.exec_pty import STDERR, ExecError, ExecSession
from gpuyard.edge.hang_up import hang_up

log = logging.getLogger("gpuyard.ssh_gateway")

# Queued stdin beyond this pauses the user's channel until the engine has taken it.
_STDIN_HIGH = 1024 * 1024
_STDIN_LOW = 256 * 1024
# Close tasks in flight (the loop keeps only weak references to tasks).
_closing: set[asyncio.Task[None]] = set()

MARKER_ENV = "GPUYARD_EXEC"
# SIGHUP then SIGCONT (a terminal's hang-up) to every process whose environment holds
# the marker; POSIX sh and cat only (command substitution drops the NUL separators).
_HANGUP = (
    'for d in /proc/[0-9]*; do case "$(cat "$d/environ" 2>/dev/null)" in '
    '*{marker}*) kill -HUP "${d#/proc/}" 2>/dev/null; kill -CONT "${d#/proc/}" 2>/dev/null;; '
    "esac; done; true"
)


class ExecBackend:
    """One user session channel served by one engine exec process."""

    def __init__(self, down: asyncssh.SSHServerChannel[bytes]) -> None:
        self.down = down
        self.exec: ExecSession | None = None
        self._stdin: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._queued = 0
        self._paused = False
        self._writable = asyncio.Event()
        self._writable.set()
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False
        self._ended = False  # the process was seen to exit
        self._marker = f"{MARKER_ENV}={secrets.token_hex(12)}"
        self._where: tuple[str, ssl.SSLContext | None, str] | None = None

    async def start(
        self,
        engine_url: str,
        ssl_context: ssl.SSLContext | None,
        container: str,
        *,
        command: str | None,
        env: Mapping[str, str],
        term_type: str | None,
        term_size: tuple[int, int, int, int],
    ) -> None:
        """Start the process and the pumps. Raises ExecError (ContainerNotRunning when
        the container is gone)."""
        tty = term_type is not None
        cols, rows = term_size[0], term_size[1]
        full_env = dict(env)
        name, _, value = self._marker.partition("=")
        full_env[name] = value
        self._where = (engine_url, ssl_context, container)
        if tty:
            full_env["TERM"] = term_type or "xterm"
        self.exec = ExecSession(engine_url, ssl=ssl_context)
        cmd = ["/bin/sh", "-c", command] if command is not None else None
        await self.exec.start(
            container, cmd, tty=tty, env=full_env, rows=rows or None, cols=cols or None
        )
        self._tasks = [
            asyncio.create_task(self._pump_output()),
            asyncio.create_task(self._pump_input()),
        ]

    async def _pump_output(self) -> None:
        assert self.exec is not None
        try:
            while True:
                await self._writable.wait()
                stream, data = await self.exec.read_stream()
                if not data:
                    break
                self.down.write(data, asyncssh.EXTENDED_DATA_STDERR if stream == STDERR else None)
            code = await self.exec.wait()
            self._ended = True
        except (ExecError, OSError) as exc:
            log.info("exec session ended with an engine error: %s", exc)
            code = 255
        if self._closed:
            return
        with contextlib.suppress(asyncssh.Error, BrokenPipeError, OSError):
            self.down.write_eof()
            # An exit code the engine could not tell reads as a failure, never success.
            self.down.exit(code if 0 <= code <= 255 else 255)

    async def _pump_input(self) -> None:
        assert self.exec is not None
        while True:
            data = await self._stdin.get()
            if data is None:
                await self.exec.close_stdin()
                return
            self._queued -= len(data)
            if self._paused and self._queued <= _STDIN_LOW:
                self._paused = False
                self.down.resume_reading()
            await self.exec.write(data)

    def write(self, data: bytes, datatype: asyncssh.DataType) -> None:
        if datatype is not None:
            return  # no extended data goes to a process's stdin
        self._queued += len(data)
        self._stdin.put_nowait(data)
        if not self._paused and self._queued > _STDIN_HIGH:
            self._paused = True
            self.down.pause_reading()

    def eof(self) -> None:
        self._stdin.put_nowait(None)

    def resize(self, cols: int, rows: int, pixwidth: int, pixheight: int) -> None:
        if self.exec is not None:
            self._tasks.append(asyncio.create_task(self._resize(rows, cols)))

    async def _resize(self, rows: int, cols: int) -> None:
        if self.exec is not None:
            await self.exec.resize(rows, cols)

    def signal(self, name: str) -> None:
        """Signals cannot be sent through the exec API; a pty user's Ctrl-C is a byte
        the terminal turns into SIGINT anyway."""

    def pause_output(self) -> None:
        self._writable.clear()

    def resume_output(self) -> None:
        self._writable.set()

    def close(self) -> None:
        self._closed = True
        for task in self._tasks:
            task.cancel()
        if self.exec is not None:
            task = asyncio.get_running_loop().create_task(self._close_exec(self.exec))
            _closing.add(task)
            task.add_done_callback(_closing.discard)

    async def _close_exec(self, exec_session: ExecSession) -> None:
        """Drop the stream; a process still running is hung up first (best effort)."""
        try:
            if not self._ended and self._where is not None:
                engine_url, ssl_context, container = self._where
                await hang_up(
                    lambda: ExecSession(engine_url, ssl=ssl_context),
                    container,
                    _HANGUP.replace("{marker}", self._marker),
                    what=f"ssh session {self._marker}",
                )
        finally:
            await exec_session.close()
