"""The web terminal's bridge: one WebSocket joined to one shell with a PTY in a
cluster's container (an exec session, edge/exec_pty.py). Pure asyncio: two pumps on
the event loop, no threads.

Protocol (``GET /v1/clusters/{id}/terminal``, api/console/terminal.py):

- binary frames carry terminal bytes, both ways (keystrokes in, screen output out);
- text frames carry JSON control messages. From the client:
  ``{"type": "resize", "rows": R, "cols": C}``. From the server:
  ``{"type": "exit", "code": N}`` once the shell has exited (N is -1 when the engine
  could not tell), then a close with code 1000, and ``{"type": "error", "message": ...}``
  for a control message it could not use (the session goes on).

The session ends when the shell exits (exit message, close 1000), when the client
goes away (the exec stream is dropped, so the shell sees its terminal hang up), or
when the caller's access ends (a guard the opener passes; close 4403 with its
reason, and the shell is hung up).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from gpuyard.edge.exec_pty import ExecSession
from gpuyard.edge.hang_up import HANGUP_RETRY_S, hang_up
from gpuyard.runtimes.capabilities import ExecAccess

log = logging.getLogger(__name__)

# Terminal sizes a client may ask for (xterm allows far less than this upper bound).
MAX_ROWS = 1000
MAX_COLS = 1000
DEFAULT_ROWS = 24
DEFAULT_COLS = 80
# The environment every terminal's shell gets on top of the container's.
SHELL_ENV = {"TERM": "xterm-256color"}
# How long to wait for the engine's exit code once the shell's output has ended.
EXIT_CODE_WAIT_S = 10.0
# Close codes (RFC 6455 allows 4000-4999 for applications).
CLOSE_NORMAL = 1000
CLOSE_INTERNAL = 1011
CLOSE_NOT_RUNNING = 4409
CLOSE_ACCESS_ENDED = 4403
# A close frame's reason is at most 123 bytes.
_REASON_BYTES = 123


class ClientSocket(Protocol):
    """The browser's side, already accepted (api/console/terminal.py adapts Starlette's)."""

    async def receive(self) -> bytes | str | None:
        """The next frame's payload: bytes (binary), str (text); None when the client
        has gone."""

    async def send_bytes(self, data: bytes) -> None: ...

    async def send_text(self, data: str) -> None: ...

    async def close(self, code: int, reason: str) -> None: ...


class TerminalProcess(Protocol):
    """The shell's side: an :class:`ExecSession` after its start, or a fake in tests."""

    async def read(self) -> bytes: ...

    async def write(self, data: bytes) -> None: ...

    async def resize(self, rows: int, cols: int) -> bool: ...

    async def wait(self, timeout_s: float = ...) -> int: ...

    async def close(self) -> None: ...


@dataclass(frozen=True)
class Resize:
    rows: int
    cols: int


def clip_reason(text: str) -> str:
    """``text`` cut to fit a close frame's reason (123 bytes of UTF-8)."""
    data = text.encode()
    if len(data) <= _REASON_BYTES:
        return text
    return data[: _REASON_BYTES - 3].decode(errors="ignore") + "..."


def terminal_size(rows: object, cols: object) -> Resize | None:
    """A valid size (integers, 1 to 1000 each), else None."""
    if isinstance(rows, bool) or isinstance(cols, bool):
        return None
    if not isinstance(rows, int) or not isinstance(cols, int):
        return None
    if not (1 <= rows <= MAX_ROWS and 1 <= cols <= MAX_COLS):
        return None
    return Resize(rows, cols)


def parse_control(text: str) -> Resize | str:
    """A client's control message: a :class:`Resize`, or the reason it is unusable."""
    try:
        doc: Any = json.loads(text)
    except ValueError:
        return "control messages are JSON objects"
    if not isinstance(doc, dict):
        return "control messages are JSON objects"
    kind = doc.get("type")
    if kind != "resize":
        return f"unknown control message type {kind!r} (known: 'resize')"
    size = terminal_size(doc.get("rows"), doc.get("cols"))
    if size is None:
        return f"resize needs integer rows and cols from 1 to {MAX_ROWS}"
    return size


@dataclass(frozen=True)
class BridgeResult:
    """How a session ended: ``exit_code`` when the shell exited (-1: unknown), None
    when the client left first or the caller's access ended (``access_ended``)."""

    exit_code: int | None
    access_ended: bool = False


async def run_bridge(
    client: ClientSocket, process: TerminalProcess, guard: Awaitable[str] | None = None
) -> BridgeResult:
    """Pump bytes and control messages between ``client`` and ``process`` until one
    side ends; then close the other (the client with the exit message and code 1000,
    or the process's stream). ``guard``: returns (a reason) when the caller may no
    longer use the terminal; the client is then closed with 4403 and that reason.
    Always closes ``process``; never raises for a peer that went away."""
    out = asyncio.create_task(_pump_out(client, process))
    inp = asyncio.create_task(_pump_in(client, process))
    watch: asyncio.Task[str] | None = asyncio.ensure_future(guard) if guard is not None else None
    tasks: set[asyncio.Task[Any]] = {out, inp} | ({watch} if watch is not None else set())
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        if watch is not None and watch in done and watch.exception() is None:
            with contextlib.suppress(Exception):
                await client.close(CLOSE_ACCESS_ENDED, watch.result())
            return BridgeResult(None, access_ended=True)
        if out in done and out.exception() is not None:
            log.warning("terminal output stream failed: %r", out.exception())
            with contextlib.suppress(Exception):
                await client.close(CLOSE_INTERNAL, "the terminal's stream from the engine failed")
            return BridgeResult(None)
        if out in done and out.result():
            # The shell's output ended: it exited (or the container stopped).
            inp.cancel()
            code = await process.wait(EXIT_CODE_WAIT_S)
            with contextlib.suppress(Exception):
                await client.send_text(json.dumps({"type": "exit", "code": code}))
                await client.close(CLOSE_NORMAL, f"the shell exited with code {code}")
            return BridgeResult(code)
        return BridgeResult(None)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await process.close()


async def _pump_out(client: ClientSocket, process: TerminalProcess) -> bool:
    """Shell output to the client. True when the output ended; False when the client
    could not be written to (it left)."""
    while True:
        data = await process.read()
        if not data:
            return True
        try:
            await client.send_bytes(data)
        except Exception:  # the client went away mid-send: the other pump notices too
            return False


async def _pump_in(client: ClientSocket, process: TerminalProcess) -> None:
    """Client frames to the shell, until the client leaves."""
    while True:
        frame = await client.receive()
        if frame is None:
            return
        if isinstance(frame, bytes):
            await process.write(frame)
            continue
        control = parse_control(frame)
        if isinstance(control, Resize):
            await process.resize(control.rows, control.cols)
        else:
            await client.send_text(json.dumps({"type": "error", "message": control}))


# -- reaching the container --------------------------------------------------------


@dataclass(frozen=True)
class ExecTarget:
    """Where a cluster's shell runs: an engine (URL and TLS context) and a container."""

    engine_url: str
    ssl: ssl.SSLContext | None
    container: str


def exec_target(runtime: ExecAccess, container: str) -> ExecTarget:
    """The exec endpoint of ``runtime``'s engine (runtimes/capabilities.py) and
    ``container`` on it. Blocking (an SSH host's tunnel is started if it is down): call
    it in a thread. Raises RuntimeFailure when the runtime has no engine to exec in."""
    endpoint = runtime.exec_endpoint()
    return ExecTarget(endpoint.url, endpoint.ssl, container)


# The shell reports its pid (its session id: the engine makes a tty exec a session
# leader) in an OSC sequence before it becomes the login shell; terminals ignore OSC
# sequences they do not know, and ShellSession strips this one.
_PID_OSC = b"\x1b]7772;"
_LOGIN_SHELL = (
    "printf '\\033]7772;%s\\007' \"$$\"; "
    "if command -v bash >/dev/null 2>&1; then exec bash -l; else exec /bin/sh -l; fi"
)
SHELL_COMMAND: tuple[str, ...] = ("/bin/sh", "-c", _LOGIN_SHELL)
# How much output is searched for the pid sequence, and its longest form.
LOOK_LIMIT = 64 * 1024
_PID_SEQUENCE_MAX = 64
# A hang-up by hand: SIGHUP, then SIGCONT (as the kernel does when a terminal hangs
# up), to every process of the shell's session. POSIX sh builtins only, reading
# /proc/PID/stat: "pid (comm) state ppid pgrp session ...".
_HANGUP = (
    'for d in /proc/[0-9]*; do read -r l < "$d/stat" 2>/dev/null || continue; '
    'r=${l##*") "}; set -- $r; '
    '[ "$4" = "{sid}" ] && kill -HUP "${d#/proc/}" 2>/dev/null && kill -CONT "${d#/proc/}" '
    "2>/dev/null; done; true"
)


def _partial_prefix(buf: bytes, sequence: bytes) -> int:
    """The length of the longest end of ``buf`` that begins ``sequence``."""
    for n in range(min(len(buf), len(sequence) - 1), 0, -1):
        if sequence.startswith(buf[-n:]):
            return n
    return 0


def _exec_session(target: ExecTarget) -> ExecSession:
    return ExecSession(target.engine_url, ssl=target.ssl)


class ShellSession:
    """A login shell in a container (a :class:`TerminalProcess`).

    Engines leave an exec's process running when its stream is dropped (Docker and
    Podman alike: the PTY does not hang up), so :meth:`close` of a shell that has not
    exited hangs its session up by hand, through a second exec, as closing a terminal
    window does."""

    def __init__(
        self, target: ExecTarget, open_exec: Callable[[ExecTarget], ExecSession] | None = None
    ) -> None:
        """``open_exec``: makes the exec sessions (the shell's, a hang-up's) on
        ``target``'s engine; tests pass fakes."""
        self.target = target
        self._open_exec = open_exec or _exec_session
        self.hangup_retry_s = HANGUP_RETRY_S
        self.exec = self._open_exec(target)
        self.session_id: int | None = None
        self._head = b""  # output held back: it may begin the pid sequence
        self._looking = True
        self._seen = 0  # bytes of output read while looking
        self._ended = False

    async def start(self, size: Resize) -> None:
        """Raises exec_pty's ContainerNotRunning / ExecError."""
        await self.exec.start(
            self.target.container,
            SHELL_COMMAND,
            tty=True,
            env=SHELL_ENV,
            rows=size.rows,
            cols=size.cols,
        )

    async def read(self) -> bytes:
        """The shell's output, without the pid sequence. The sequence is looked for in
        the first LOOK_LIMIT bytes, wherever it lands: what the client types at once is
        echoed by the PTY, and may come before it."""
        while self._looking:
            data = await self.exec.read()
            if not data:
                self._looking, self._ended = False, True
                out, self._head = self._head, b""
                return out
            self._seen += len(data)
            out = self._take_pid(self._head + data)
            if out:
                return out
        data = await self.exec.read()
        if not data:
            self._ended = True
        return data

    def _take_pid(self, buf: bytes) -> bytes:
        """Find the pid sequence in ``buf`` (held-back bytes first); the output to pass
        on now. Holds back only what may be the start of a sequence split across reads."""
        start = buf.find(_PID_OSC)
        end = buf.find(b"\x07", start + len(_PID_OSC)) if start >= 0 else -1
        if start >= 0 and end >= 0:
            digits = buf[start + len(_PID_OSC) : end]
            if digits.isdigit():
                self.session_id = int(digits)
            self._looking, self._head = False, b""
            return buf[:start] + buf[end + 1 :]
        if self._seen > LOOK_LIMIT or (start >= 0 and len(buf) - start > _PID_SEQUENCE_MAX):
            self._looking, self._head = False, b""  # none: a shell of another kind
            return buf
        keep = len(buf) - start if start >= 0 else _partial_prefix(buf, _PID_OSC)
        self._head = buf[len(buf) - keep :] if keep else b""
        return buf[: len(buf) - keep]

    async def write(self, data: bytes) -> None:
        await self.exec.write(data)

    async def resize(self, rows: int, cols: int) -> bool:
        return await self.exec.resize(rows, cols)

    async def wait(self, timeout_s: float = EXIT_CODE_WAIT_S) -> int:
        code = await self.exec.wait(timeout_s)
        self._ended = True
        return code

    async def close(self) -> None:
        """Drop the stream; a shell still running is hung up first (best effort)."""
        try:
            if not self._ended and self.session_id is not None:
                await hang_up(
                    lambda: self._open_exec(self.target),
                    self.target.container,
                    _HANGUP.replace("{sid}", str(self.session_id)),
                    what=f"shell session {self.session_id}",
                    retry_s=self.hangup_retry_s,
                )
        finally:
            await self.exec.close()


async def open_shell(target: ExecTarget, size: Resize) -> ShellSession:
    """Start a login shell with a PTY of ``size`` in ``target``'s container. Raises
    exec_pty's ContainerNotRunning / ExecError (the session is closed first)."""
    session = ShellSession(target)
    try:
        await session.start(size)
    except BaseException:
        await session.exec.close()
        raise
    return session
