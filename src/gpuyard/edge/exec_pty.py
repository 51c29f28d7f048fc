"""An asyncio client for the Docker Engine API's exec endpoints (Docker, and Podman's
Docker-compatible service), with the output stream read straight off the socket.

One :class:`ExecSession` is one process started inside a running container::

    async with ExecSession("unix:///run/podman/podman.sock") as s:
        await s.start("gyXXXXXXXX-abcdef0123456", None, tty=True, rows=24, cols=80)
        await s.write(b"echo hi; exit 3\\n")
        while chunk := await s.read():
            ...
        code = await s.wait()            # 3

The engine calls are ``POST /containers/{c}/exec`` (create), ``POST /exec/{id}/start``
with ``Connection: Upgrade`` (the connection is then hijacked: a raw bidirectional
byte stream, our stdin one way and the process's output the other), ``POST
/exec/{id}/resize?h=&w=`` and ``GET /exec/{id}/json`` (exit code). Everything runs on
the event loop: no threads, no docker SDK.

With ``tty=True`` the output is the terminal's bytes (stdout and stderr merged by the
pty). Without a tty the engine frames stdout and stderr (8-byte headers); :meth:`read`
returns both, :meth:`read_stream` says which stream each chunk came from.

Engine URLs: ``unix:///path.sock``, ``tcp://host:port`` or ``http://host:port``, and
``https://host:port`` (pass an ``ssl.SSLContext`` with the client certificate).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl as ssl_module
import struct
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any
from urllib.parse import quote, urlsplit

# A login shell, bash where the image has it (most do), else POSIX sh.
DEFAULT_SHELL: tuple[str, ...] = (
    "/bin/sh",
    "-c",
    "if command -v bash >/dev/null 2>&1; then exec bash -l; else exec /bin/sh -l; fi",
)
STDOUT = 1
STDERR = 2
_READ_CHUNK = 64 * 1024
_HEAD_LIMIT = 64 * 1024
_MAX_BODY = 8 * 1024 * 1024


class ExecError(Exception):
    """An engine refused or failed an exec call. ``status`` is the HTTP status (0 when
    the engine could not be reached); ``message`` is the engine's own text."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


class ContainerNotRunning(ExecError):
    """The container does not exist or is not running (404 / 409 from the engine)."""


def _endpoint(url: str) -> tuple[str, str, int, bool]:
    """``(kind, path_or_host, port, tls)`` of an engine URL; kind is ``unix`` or ``tcp``."""
    parts = urlsplit(url)
    if parts.scheme in ("unix", "http+unix"):
        path = (parts.netloc + parts.path) if parts.netloc else parts.path
        if not path:
            raise ValueError(f"no socket path in engine URL {url!r}")
        return "unix", path, 0, False
    if parts.scheme in ("tcp", "http", "https"):
        if not parts.hostname:
            raise ValueError(f"no host in engine URL {url!r}")
        tls = parts.scheme == "https"
        return "tcp", parts.hostname, parts.port or (2376 if tls else 2375), tls
    raise ValueError(f"unsupported engine URL {url!r} (unix://, tcp://, http:// or https://)")


class EngineHttp:
    """Minimal HTTP/1.1 to one engine: a fresh connection per request (the engine's API
    is local or tunnelled; a connection costs well under a millisecond)."""

    def __init__(
        self,
        url: str,
        *,
        ssl: ssl_module.SSLContext | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        self.url = url
        self._kind, self._where, self._port, tls = _endpoint(url)
        self._ssl: ssl_module.SSLContext | None = ssl
        if tls and ssl is None:
            self._ssl = ssl_module.create_default_context()
        self.timeout_s = timeout_s

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A new connection to the engine. Raises ExecError (status 0) when it cannot."""
        try:
            async with asyncio.timeout(self.timeout_s):
                if self._kind == "unix":
                    return await asyncio.open_unix_connection(self._where, limit=_HEAD_LIMIT)
                return await asyncio.open_connection(
                    self._where, self._port, ssl=self._ssl, limit=_HEAD_LIMIT
                )
        except (OSError, TimeoutError) as exc:
            raise ExecError(f"cannot reach the container engine at {self.url}: {exc}") from exc

    @staticmethod
    def request_bytes(
        method: str, path: str, body: object | None, extra: Mapping[str, str] | None = None
    ) -> bytes:
        payload = b"" if body is None else json.dumps(body).encode()
        lines = [f"{method} {path} HTTP/1.1", "Host: docker"]
        if body is not None:
            lines.append("Content-Type: application/json")
        lines.append(f"Content-Length: {len(payload)}")
        lines.extend(f"{k}: {v}" for k, v in (extra or {}).items())
        return ("\r\n".join(lines) + "\r\n\r\n").encode() + payload

    @staticmethod
    async def read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
        """Status and (lower-cased) headers of a response."""
        try:
            raw = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
            raise ExecError("the container engine sent no valid HTTP response") from exc
        lines = raw.decode("latin-1").split("\r\n")
        try:
            status = int(lines[0].split(" ", 2)[1])
        except (IndexError, ValueError) as exc:
            raise ExecError(f"bad HTTP status line from the engine: {lines[0][:100]!r}") from exc
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if ":" in line:
                k, v = line.split(":", 1)
                headers[k.strip().lower()] = v.strip()
        return status, headers

    @staticmethod
    async def read_body(reader: asyncio.StreamReader, headers: Mapping[str, str]) -> bytes:
        if headers.get("transfer-encoding", "").lower() == "chunked":
            out = bytearray()
            while True:
                size_line = await reader.readuntil(b"\r\n")
                size = int(size_line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    with contextlib.suppress(asyncio.IncompleteReadError):
                        await reader.readuntil(b"\r\n")
                    return bytes(out)
                if len(out) + size > _MAX_BODY:
                    raise ExecError("the engine's answer is too large")
                out += await reader.readexactly(size)
                await reader.readexactly(2)
        if "content-length" in headers:
            n = int(headers["content-length"])
            if n > _MAX_BODY:
                raise ExecError("the engine's answer is too large")
            return await reader.readexactly(n)
        return await reader.read(_MAX_BODY)

    async def call(self, method: str, path: str, body: object | None = None) -> tuple[int, Any]:
        """One request; ``(status, decoded JSON or None)``. Raises ExecError when the
        engine cannot be reached or answers garbage (never for an HTTP error status)."""
        reader, writer = await self.connect()
        try:
            async with asyncio.timeout(self.timeout_s):
                writer.write(self.request_bytes(method, path, body, {"Connection": "close"}))
                await writer.drain()
                status, headers = await self.read_head(reader)
                raw = await self.read_body(reader, headers)
        except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError) as exc:
            raise ExecError(f"the container engine did not answer {method} {path}: {exc}") from exc
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
        try:
            data = json.loads(raw) if raw.strip() else None
        except ValueError:
            data = raw.decode("utf-8", "replace")
        return status, data


def engine_message(data: Any) -> str:
    """The engine's error text from an error body (``{"message": ...}`` or text)."""
    if isinstance(data, dict):
        return str(data.get("message") or data.get("cause") or data)
    return str(data or "")


class ExecSession:
    """One process run inside a container through the engine's exec API.

    Lifecycle: :meth:`start` once; then :meth:`read` until it returns ``b""`` while
    writing with :meth:`write` (and :meth:`close_stdin` for EOF); :meth:`wait` for the
    exit code; :meth:`close` always (or use ``async with``). :meth:`resize` may be
    called any time after start. Not safe for two concurrent readers; one reader and
    one writer at a time is the intended use.
    """

    def __init__(
        self,
        engine_url: str,
        *,
        ssl: ssl_module.SSLContext | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        self.http = EngineHttp(engine_url, ssl=ssl, timeout_s=timeout_s)
        self.exec_id: str | None = None
        self.tty = False
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._pending: list[tuple[int, bytes]] = []
        self._eof = False
        self._stdin_closed = False
        self._exit_code: int | None = None

    async def __aenter__(self) -> ExecSession:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def start(
        self,
        container: str,
        cmd: Sequence[str] | None = None,
        *,
        tty: bool = True,
        env: Mapping[str, str] | None = None,
        rows: int | None = None,
        cols: int | None = None,
        user: str | None = None,
        workdir: str | None = None,
    ) -> str:
        """Create and start the process in ``container`` (a name or id) and return the
        exec id. ``cmd`` None runs :data:`DEFAULT_SHELL`; ``env`` adds to the
        container's environment; ``rows``/``cols`` set the terminal size (tty only).

        Raises ContainerNotRunning when the container is missing or not running, and
        ExecError for anything else the engine refuses. Call once per session.
        """
        if self.exec_id is not None:
            raise RuntimeError("ExecSession.start was already called")
        self.tty = tty
        config: dict[str, Any] = {
            "AttachStdin": True,
            "AttachStdout": True,
            "AttachStderr": True,
            "Tty": tty,
            "Cmd": list(cmd) if cmd else list(DEFAULT_SHELL),
            "Env": [f"{k}={v}" for k, v in (env or {}).items()],
        }
        if tty and rows and cols:
            config["ConsoleSize"] = [rows, cols]  # Docker 1.42+; others ignore it
        if user:
            config["User"] = user
        if workdir:
            config["WorkingDir"] = workdir
        status, data = await self.http.call(
            "POST", f"/containers/{quote(container, safe='')}/exec", config
        )
        if status in (404, 409):
            raise ContainerNotRunning(engine_message(data), status)
        if status >= 300 or not isinstance(data, dict) or not data.get("Id"):
            raise ExecError(f"exec create failed: {engine_message(data)}", status)
        self.exec_id = str(data["Id"])
        await self._attach()
        if tty and rows and cols:
            await self.resize(rows, cols)
        return self.exec_id

    async def _attach(self) -> None:
        assert self.exec_id is not None
        reader, writer = await self.http.connect()
        request = self.http.request_bytes(
            "POST",
            f"/exec/{self.exec_id}/start",
            {"Detach": False, "Tty": self.tty},
            {"Connection": "Upgrade", "Upgrade": "tcp"},
        )
        try:
            async with asyncio.timeout(self.http.timeout_s):
                writer.write(request)
                await writer.drain()
                status, headers = await self.http.read_head(reader)
                if status not in (101, 200):
                    body = await self.http.read_body(reader, headers)
                    text = body.decode("utf-8", "replace")
                    with contextlib.suppress(ValueError):
                        text = engine_message(json.loads(text))
                    kind = ContainerNotRunning if status in (404, 409) else ExecError
                    raise kind(f"exec start failed: {text}", status)
        except BaseException:
            writer.close()
            raise
        # Docker answers 101 and then speaks raw; Podman may answer 200 with no length:
        # either way everything after the head is the process's stream.
        self._reader, self._writer = reader, writer

    async def read_stream(self) -> tuple[int, bytes]:
        """The next chunk of output and its stream (:data:`STDOUT` or :data:`STDERR`;
        always STDOUT with a tty); ``(STDOUT, b"")`` once the process's output ended."""
        if self._pending:
            return self._pending.pop(0)
        if self._eof or self._reader is None:
            return STDOUT, b""
        try:
            if self.tty:
                data = await self._reader.read(_READ_CHUNK)
                if data:
                    return STDOUT, data
            else:
                head = await self._reader.readexactly(8)
                stream, size = head[0], struct.unpack(">I", head[4:8])[0]
                data = await self._reader.readexactly(size) if size else b""
                if data or size == 0:
                    return (STDERR if stream == STDERR else STDOUT), data
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        self._eof = True
        return STDOUT, b""

    async def read(self) -> bytes:
        """The next chunk of output (stdout and stderr alike); ``b""`` at the end.
        An empty frame from the engine is skipped, so ``b""`` always means EOF."""
        while True:
            _, data = await self.read_stream()
            if data or self._eof:
                return data

    async def write(self, data: bytes) -> None:
        """Send ``data`` to the process's stdin (waits while the engine is slower than
        the writer). Silently dropped after stdin was closed or the process ended."""
        if self._writer is None or self._stdin_closed or not data:
            return
        try:
            self._writer.write(data)
            await self._writer.drain()
        except (ConnectionError, RuntimeError):
            self._stdin_closed = True

    async def close_stdin(self) -> None:
        """Half-close the stream: the process reads EOF on stdin; output keeps coming."""
        if self._writer is None or self._stdin_closed:
            return
        self._stdin_closed = True
        with contextlib.suppress(OSError, RuntimeError):
            if self._writer.can_write_eof():
                self._writer.write_eof()

    async def resize(self, rows: int, cols: int) -> bool:
        """Set the terminal size (tty sessions). Best effort: False when the engine
        refused (the process already ended, or not yet started: retried briefly)."""
        if self.exec_id is None or not self.tty or rows <= 0 or cols <= 0:
            return False
        path = f"/exec/{self.exec_id}/resize?h={int(rows)}&w={int(cols)}"
        for _ in range(10):
            try:
                status, _ = await self.http.call("POST", path)
            except ExecError:
                return False
            if status < 300:
                return True
            if self._eof:
                return False
            # Podman may not have the exec's process registered the instant start answers.
            await asyncio.sleep(0.02)
        return False

    async def inspect(self) -> dict[str, Any]:
        """The engine's ``/exec/{id}/json`` answer. Raises ExecError."""
        if self.exec_id is None:
            raise ExecError("the exec session was not started")
        status, data = await self.http.call("GET", f"/exec/{self.exec_id}/json")
        if status >= 300 or not isinstance(data, dict):
            raise ExecError(f"exec inspect failed: {engine_message(data)}", status)
        return data

    async def wait(self, timeout_s: float = 10.0) -> int:
        """The process's exit code, once its output has ended (call after :meth:`read`
        returned ``b""``; it drains the rest of the output otherwise). Polls the engine
        until it reports the process finished; -1 when the engine never says (the
        container was removed, or ``timeout_s`` passed)."""
        if self._exit_code is not None:
            return self._exit_code
        while not self._eof and self._reader is not None:
            await self.read_stream()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        delay = 0.005
        while True:
            try:
                info = await self.inspect()
            except ExecError:
                self._exit_code = -1
                return -1
            code = info.get("ExitCode")
            if not info.get("Running") and code is not None:
                self._exit_code = int(code)
                return self._exit_code
            if loop.time() >= deadline:
                return -1
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.2)

    async def close(self) -> None:
        """Drop the stream. A tty process then sees its terminal hang up (SIGHUP) and
        normally ends; a process ignoring that keeps running in the container.
        Idempotent."""
        writer, self._writer = self._writer, None
        self._eof = True
        if writer is not None:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
