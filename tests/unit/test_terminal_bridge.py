"""The web terminal's bridge with fake ends: control messages, the order of the end of
a session (exit message, then close 1000), a client that leaves, a failing engine
stream, and how a runtime's engine becomes an exec target."""

from __future__ import annotations

import asyncio
import json
import ssl
from dataclasses import dataclass, field
from typing import Any

import pytest

from gpuyard.core.errors import RuntimeFailure
from gpuyard.edge import terminal_bridge as tb
from gpuyard.edge.exec_pty import ContainerNotRunning, ExecError
from gpuyard.runtimes.engines.engine import DEFAULT_POLICY, Engine
from gpuyard.runtimes.engines.exec_endpoint import engine_exec_endpoint
from gpuyard.runtimes.engines.runtime import DockerEngineRuntime
from gpuyard.runtimes.hosts.runtimes import HostEngineRuntime
from gpuyard.testing.fake_runtime import FakeRuntime


def test_parse_control() -> None:
    assert tb.parse_control('{"type": "resize", "rows": 40, "cols": 120}') == tb.Resize(40, 120)
    for bad in (
        "nope",
        "[]",
        '{"type": "resize", "rows": 0, "cols": 80}',
        '{"type": "resize", "rows": 24, "cols": 1001}',
        '{"type": "resize", "rows": true, "cols": 80}',
        '{"type": "resize", "rows": 24.0, "cols": 80}',
        '{"type": "resize", "rows": "24", "cols": 80}',
        '{"type": "input", "data": "ls"}',
    ):
        assert isinstance(tb.parse_control(bad), str), bad


def test_clip_reason_fits_a_close_frame() -> None:
    assert tb.clip_reason("short") == "short"
    long = "é" * 200
    clipped = tb.clip_reason(long)
    assert len(clipped.encode()) <= 123 and clipped.endswith("...")


@dataclass
class FakeClient:
    inbox: asyncio.Queue[bytes | str | None] = field(default_factory=asyncio.Queue)
    sent: list[bytes | str] = field(default_factory=list)
    closed: tuple[int, str] | None = None
    fail_sends: bool = False

    async def receive(self) -> bytes | str | None:
        return await self.inbox.get()

    async def send_bytes(self, data: bytes) -> None:
        if self.fail_sends:
            raise ConnectionError("gone")
        self.sent.append(data)

    async def send_text(self, data: str) -> None:
        self.sent.append(data)

    async def close(self, code: int, reason: str) -> None:
        self.closed = (code, reason)


@dataclass
class FakeProcess:
    output: asyncio.Queue[bytes | Exception] = field(default_factory=asyncio.Queue)
    written: list[bytes] = field(default_factory=list)
    sizes: list[tuple[int, int]] = field(default_factory=list)
    code: int = 0
    closed: bool = False

    async def read(self) -> bytes:
        item = await self.output.get()
        if isinstance(item, Exception):
            raise item
        return item

    async def write(self, data: bytes) -> None:
        self.written.append(data)

    async def resize(self, rows: int, cols: int) -> bool:
        self.sizes.append((rows, cols))
        return True

    async def wait(self, timeout_s: float = 10.0) -> int:
        return self.code

    async def close(self) -> None:
        self.closed = True


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 5))


def test_bytes_resize_and_exit() -> None:
    async def go() -> tuple[tb.BridgeResult, FakeClient, FakeProcess]:
        client, process = FakeClient(), FakeProcess(code=3)
        task = asyncio.create_task(tb.run_bridge(client, process))
        await client.inbox.put(b"ls\n")
        await client.inbox.put(json.dumps({"type": "resize", "rows": 50, "cols": 100}))
        await client.inbox.put('{"type": "bogus"}')
        await process.output.put(b"file\r\n")
        for _ in range(20):
            await asyncio.sleep(0)
        await process.output.put(b"")
        return await task, client, process

    result, client, process = run(go())
    assert result == tb.BridgeResult(3)
    assert process.written == [b"ls\n"] and process.sizes == [(50, 100)] and process.closed
    assert b"file\r\n" in client.sent
    texts = [json.loads(s) for s in client.sent if isinstance(s, str)]
    assert texts[0]["type"] == "error" and "bogus" in texts[0]["message"]
    # The exit message is the last frame, then a normal close.
    assert client.sent[-1] == json.dumps({"type": "exit", "code": 3})
    assert client.closed == (1000, "the shell exited with code 3")


def test_a_client_that_leaves_closes_the_process() -> None:
    async def go() -> tuple[tb.BridgeResult, FakeClient, FakeProcess]:
        client, process = FakeClient(), FakeProcess()
        task = asyncio.create_task(tb.run_bridge(client, process))
        await client.inbox.put(None)
        return await task, client, process

    result, client, process = run(go())
    assert result == tb.BridgeResult(None) and process.closed and client.closed is None


def test_a_client_that_cannot_be_written_to_ends_the_session() -> None:
    async def go() -> tuple[tb.BridgeResult, FakeProcess]:
        client, process = FakeClient(fail_sends=True), FakeProcess()
        task = asyncio.create_task(tb.run_bridge(client, process))
        await process.output.put(b"data")
        return await task, process

    result, process = run(go())
    assert result == tb.BridgeResult(None) and process.closed


def test_a_failing_engine_stream_is_an_internal_close() -> None:
    async def go() -> tuple[tb.BridgeResult, FakeClient, FakeProcess]:
        client, process = FakeClient(), FakeProcess()
        task = asyncio.create_task(tb.run_bridge(client, process))
        await process.output.put(ValueError("garbled"))
        return await task, client, process

    result, client, process = run(go())
    assert result == tb.BridgeResult(None) and process.closed
    assert client.closed is not None and client.closed[0] == 1011


class Tunnel:
    def url(self) -> str:
        return "unix:///tmp/tunnel.sock"


@dataclass
class Tls:
    cert: tuple[str, str] | None = None
    ca_cert: str | None = None
    verify: bool = False


def test_exec_targets() -> None:
    local = DockerEngineRuntime("unix:///run/podman/podman.sock")
    target = tb.exec_target(local, "c1")
    assert target == tb.ExecTarget("unix:///run/podman/podman.sock", None, "c1")
    # An SSH host: the tunnel's socket (started when down).
    remote = HostEngineRuntime(
        "unix:///stale.sock",
        5.0,
        policy=DEFAULT_POLICY,
        tunnel=Tunnel(),  # type: ignore[arg-type]
    )
    assert tb.exec_target(remote, "c2").engine_url == "unix:///tmp/tunnel.sock"
    # A TCP engine with TLS client material (verification off here: no CA file).
    tcp = HostEngineRuntime("tcp://10.0.0.5:2376", 5.0, policy=DEFAULT_POLICY, tls=Tls())
    target = tb.exec_target(tcp, "c3")
    assert target.engine_url == "https://10.0.0.5:2376"
    assert isinstance(target.ssl, ssl.SSLContext) and target.ssl.verify_mode == ssl.CERT_NONE
    # The same for an engine's own URL written as https.
    engine = Engine("https://10.0.0.5:2376")
    engine.tls = Tls()
    assert engine_exec_endpoint(engine).url == "https://10.0.0.5:2376"
    # A runtime with no engine to exec in says so.
    with pytest.raises(RuntimeFailure):
        tb.exec_target(FakeRuntime(), "c4")


class ScriptedExec:
    """Stands in for the ExecSession under a ShellSession: output in given pieces."""

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = list(pieces)
        self.closed = False

    async def read(self) -> bytes:
        return self.pieces.pop(0) if self.pieces else b""

    async def close(self) -> None:
        self.closed = True


def shell_output(pieces: list[bytes]) -> tuple[bytes, int | None]:
    async def go() -> tuple[bytes, int | None]:
        shell = tb.ShellSession(tb.ExecTarget("unix:///nowhere.sock", None, "c"))
        shell.exec = ScriptedExec(pieces)  # type: ignore[assignment]
        out = b""
        while data := await shell.read():
            out += data
        await shell.close()  # ended: no hang-up exec is tried
        return out, shell.session_id

    result: tuple[bytes, int | None] = run(go())
    return result


def test_the_shells_pid_sequence_is_read_and_stripped() -> None:
    assert shell_output([b"\x1b]7772;42\x07/ # "]) == (b"/ # ", 42)
    # Split across reads, and followed by output in the same read.
    assert shell_output([b"\x1b]77", b"72;1234", b"\x07$ ", b"ls\r\n"]) == (b"$ ls\r\n", 1234)
    # A shell that never says: its output passes untouched.
    assert shell_output([b"hello", b" world"]) == (b"hello world", None)
    assert shell_output([b"\x1b[1mbold"]) == (b"\x1b[1mbold", None)
    assert shell_output([]) == (b"", None)
    # What the client typed at once, echoed by the PTY before the shell said its pid.
    typed = b"echo $$ > /tmp/pid\r\n"
    assert shell_output([typed, b"\x1b]7772;16\x07$ "]) == (typed + b"$ ", 16)
    assert shell_output([typed + b"\x1b]7772;", b"16\x07$ "]) == (typed + b"$ ", 16)
    assert shell_output([typed + b"\x1b]77", b"72;16\x07"]) == (typed, 16)
    # An escape that only looks like its start at first is passed on whole.
    assert shell_output([b"ab\x1b]", b"0;title\x07"]) == (b"ab\x1b]0;title\x07", None)


class KillerExec:
    """A hang-up's exec: its start fails while ``failures`` has items left."""

    def __init__(self, failures: list[Exception], started: list[tuple[str, ...]]) -> None:
        self.failures = failures
        self.started = started

    async def __aenter__(self) -> KillerExec:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def start(self, container: str, argv: tuple[str, ...], tty: bool) -> None:
        if self.failures:
            raise self.failures.pop(0)
        self.started.append(argv)

    async def read(self) -> bytes:
        return b""


def hang_up_with(failures: list[Exception]) -> tuple[list[tuple[str, ...]], ScriptedExec]:
    """Close a shell that still runs (session 42) while the engine fails ``failures``
    hang-up execs first: the argv of each hang-up that ran, and the shell's own exec."""
    started: list[tuple[str, ...]] = []
    shell_exec = ScriptedExec([b"\x1b]7772;42\x07$ "])
    sessions: list[Any] = [shell_exec]

    def open_exec(target: tb.ExecTarget) -> Any:
        return sessions.pop(0) if sessions else KillerExec(failures, started)

    async def go() -> None:
        shell = tb.ShellSession(tb.ExecTarget("unix:///nowhere.sock", None, "c"), open_exec)
        shell.hangup_retry_s = 0
        assert await shell.read() == b"$ "
        await shell.close()

    run(go())
    return started, shell_exec


def test_a_shell_left_running_is_hung_up_even_when_the_engine_fails_at_first() -> None:
    started, shell_exec = hang_up_with([ExecError("busy"), OSError("reset")])
    assert len(started) == 1 and "42" in started[0][-1]  # the session's processes
    assert shell_exec.closed


def test_a_stopped_container_needs_no_hang_up() -> None:
    started, shell_exec = hang_up_with([ContainerNotRunning("stopped")])
    assert started == [] and shell_exec.closed
