"""The TCP forwarder on real loopback sockets. All of 127/8 is local on Linux, so the
forwarder listens on 127.0.10.1 and clients pick their source address (127.0.0.2
allowed, 127.0.0.3 denied) to exercise the acl."""

from __future__ import annotations

import contextlib
import random
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from gpuyard.core.errors import RuntimeFailure
from gpuyard.net.forwarder import TcpForwarder

LISTEN = "127.0.10.1"
GOOD = "127.0.0.2"
BAD = "127.0.0.3"
TIMEOUT = 3.0


class EchoServer:
    """Echoes every connection on 127.0.0.1 until the client's EOF, then closes it.
    Counts what it accepted and what it finished, so a test can tell that a denied
    client never reached it and that a removed one was really cut off."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.sock.getsockname()[1]
        self.accepted = 0
        self.finished = threading.Semaphore(0)
        self._lock = threading.Lock()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self._lock:
                self.accepted += 1
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    def _echo(self, conn: socket.socket) -> None:
        with conn:
            try:
                while data := conn.recv(1 << 16):
                    conn.sendall(data)
            except OSError:
                pass
        self.finished.release()

    def close(self) -> None:
        # shutdown() wakes the accept() blocked in the serving thread; close() alone may not.
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def connect(port: int, source: str = GOOD) -> socket.socket:
    s = socket.create_connection((LISTEN, port), timeout=TIMEOUT, source_address=(source, 0))
    s.settimeout(TIMEOUT)
    return s


def echo(s: socket.socket, data: bytes = b"ping") -> bytes:
    s.sendall(data)
    got = b""
    while len(got) < len(data):
        chunk = s.recv(len(data) - len(got))
        if not chunk:
            break
        got += chunk
    return got


def assert_reset(s: socket.socket) -> None:
    """The forwarder dropped ``s`` with SO_LINGER 0: the client sees a RST."""
    with s, pytest.raises(ConnectionResetError):
        s.recv(1)


def assert_turned_away(port: int, source: str = GOOD) -> None:
    """A new connection from ``source`` is accepted by the kernel and then reset. On
    loopback the RST may already be there when ``connect()`` returns: that counts."""
    try:
        s = connect(port, source)
    except ConnectionResetError:
        return
    assert_reset(s)


def assert_closed(s: socket.socket) -> None:
    """``s`` was closed from the other end, by a FIN or a RST."""
    with s, contextlib.suppress(ConnectionResetError):
        assert s.recv(1) == b""


def only(*sources: str) -> Callable[[str, int], bool]:
    return lambda source, _port: source in sources


@pytest.fixture
def target() -> Iterator[EchoServer]:
    server = EchoServer()
    yield server
    server.close()


@pytest.fixture
def fwd() -> Iterator[TcpForwarder]:
    with TcpForwarder(connect_timeout_s=2.0) as forwarder:
        yield forwarder


@pytest.fixture
def port() -> int:
    return free_port(LISTEN)


def test_allowed_source_is_forwarded_denied_source_is_reset(
    fwd: TcpForwarder, target: EchoServer, port: int
) -> None:
    calls: list[tuple[str, int]] = []

    def acl(source: str, listen_port: int) -> bool:
        calls.append((source, listen_port))
        return source == GOOD

    fwd.ensure(LISTEN, port, "127.0.0.1", target.port, acl)
    assert fwd.listeners() == {(LISTEN, port)}

    assert_turned_away(port, BAD)
    with connect(port, GOOD) as good:
        assert echo(good, b"hello") == b"hello"
        # The denied client came first; had it been forwarded the target would count it.
        assert target.accepted == 1
        stats = fwd.stats()[(LISTEN, port)]
        assert (stats.accepted, stats.denied, stats.failed, stats.active) == (1, 1, 0, 1)
        assert stats.target == ("127.0.0.1", target.port)
    assert calls == [(BAD, port), (GOOD, port)]


def test_a_new_acl_applies_to_new_and_established_connections(
    fwd: TcpForwarder, target: EchoServer, port: int
) -> None:
    fwd.ensure(LISTEN, port, "127.0.0.1", target.port, only(GOOD, BAD))
    with connect(port, GOOD) as kept, connect(port, BAD) as cut:
        assert echo(kept) == b"ping" and echo(cut) == b"ping"
        fwd.ensure(LISTEN, port, "127.0.0.1", target.port, only(GOOD))
        # The session the new acl denies is cut at once; the one it allows goes on.
        assert_closed(cut)
        assert echo(kept, b"still") == b"still"
        assert_turned_away(port, BAD)
        with connect(port, GOOD) as again:
            assert echo(again, b"x") == b"x"
    assert fwd.listeners() == {(LISTEN, port)}
    stats = fwd.stats()[(LISTEN, port)]
    assert (stats.accepted, stats.denied) == (3, 1)


def test_updating_the_target_takes_effect_for_new_connections(
    fwd: TcpForwarder, target: EchoServer, port: int
) -> None:
    other = EchoServer()
    try:
        fwd.ensure(LISTEN, port, "127.0.0.1", target.port, only(GOOD))
        with connect(port) as first:
            assert echo(first) == b"ping"
            fwd.ensure(LISTEN, port, "127.0.0.1", other.port, only(GOOD))
            with connect(port) as second:
                assert echo(second) == b"ping"
            assert echo(first) == b"ping"
        assert (target.accepted, other.accepted) == (1, 1)
        assert fwd.stats()[(LISTEN, port)].target == ("127.0.0.1", other.port)
    finally:
        other.close()


def test_an_acl_that_raises_denies(fwd: TcpForwarder, target: EchoServer, port: int) -> None:
    def broken(source: str, listen_port: int) -> bool:
        raise KeyError(source)

    fwd.ensure(LISTEN, port, "127.0.0.1", target.port, broken)
    assert_turned_away(port)
    assert fwd.stats()[(LISTEN, port)].denied == 1
    assert target.accepted == 0


def test_remove_closes_established_connections_and_the_port(
    fwd: TcpForwarder, target: EchoServer, port: int
) -> None:
    fwd.ensure(LISTEN, port, "127.0.0.1", target.port, only(GOOD))
    established = connect(port)
    assert echo(established) == b"ping"

    fwd.remove(LISTEN, port)

    assert_closed(established)
    # The target's side was cut too: its echo loop ended.
    assert target.finished.acquire(timeout=TIMEOUT)
    with pytest.raises(ConnectionRefusedError):
        connect(port)
    assert fwd.listeners() == set()
    assert fwd.stats() == {}
    fwd.remove(LISTEN, port)  # idempotent


def test_a_removed_port_can_be_listened_on_again(
    fwd: TcpForwarder, target: EchoServer, port: int
) -> None:
    fwd.ensure(LISTEN, port, "127.0.0.1", target.port, only(GOOD))
    with connect(port) as s:
        assert echo(s) == b"ping"
    fwd.remove(LISTEN, port)
    fwd.ensure(LISTEN, port, "127.0.0.1", target.port, only(GOOD))
    with connect(port) as s:
        assert echo(s) == b"ping"
    # Counters start afresh with the new listener.
    assert fwd.stats()[(LISTEN, port)].accepted == 1


def test_big_payload_both_ways_is_intact(fwd: TcpForwarder, target: EchoServer, port: int) -> None:
    payload = random.Random(7).randbytes(4 * 1024 * 1024 + 13)
    fwd.ensure(LISTEN, port, "127.0.0.1", target.port, only(GOOD))
    with connect(port) as s:

        def send() -> None:
            s.sendall(payload)
            s.shutdown(socket.SHUT_WR)  # half-close: the echo must still come back

        sender = threading.Thread(target=send)
        sender.start()
        chunks: list[bytes] = []
        while chunk := s.recv(1 << 16):
            chunks.append(chunk)
        sender.join(TIMEOUT)
    assert b"".join(chunks) == payload
    stats = fwd.stats()[(LISTEN, port)]
    assert stats.bytes_to_target == stats.bytes_to_client == len(payload)


def test_half_close_passes_the_eof_and_keeps_the_other_direction(
    fwd: TcpForwarder, target: EchoServer, port: int
) -> None:
    fwd.ensure(LISTEN, port, "127.0.0.1", target.port, only(GOOD))
    with connect(port) as s:
        s.sendall(b"last words")
        s.shutdown(socket.SHUT_WR)
        got = b""
        while chunk := s.recv(100):
            got += chunk
    assert got == b"last words"
    assert target.finished.acquire(timeout=TIMEOUT)
    # Both directions ended, so the forwarder let the pipe go.
    deadline = time.monotonic() + TIMEOUT
    while fwd.stats()[(LISTEN, port)].active and time.monotonic() < deadline:
        time.sleep(0.005)
    assert fwd.stats()[(LISTEN, port)].active == 0


def test_a_refusing_target_closes_the_client_promptly(fwd: TcpForwarder, port: int) -> None:
    fwd.ensure(LISTEN, port, "127.0.0.1", free_port("127.0.0.1"), only(GOOD))
    started = time.monotonic()
    assert_turned_away(port)
    assert time.monotonic() - started < 5.0  # not a connect timeout's wait (30 s)
    stats = fwd.stats()[(LISTEN, port)]
    assert (stats.accepted, stats.failed) == (1, 1)


@pytest.fixture
def silent_target() -> Iterator[int]:
    """A port whose SYNs go unanswered: a listener that never accepts, its queue full."""
    with socket.create_server(("127.0.0.1", 0), backlog=0) as full:
        fillers = []
        for _ in range(4):
            s = socket.socket()
            s.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                s.connect(full.getsockname())
            fillers.append(s)
        yield full.getsockname()[1]
        for s in fillers:
            s.close()


def test_a_silent_target_resets_the_client_after_the_connect_timeout(
    silent_target: int, port: int
) -> None:
    with TcpForwarder(connect_timeout_s=0.2) as fwd:
        fwd.ensure(LISTEN, port, "127.0.0.1", silent_target, only(GOOD))
        started = time.monotonic()
        assert_turned_away(port)
        assert 0.15 < time.monotonic() - started < 5.0  # the 0.2 s connect timeout
        stats = fwd.stats()[(LISTEN, port)]
        assert (stats.accepted, stats.failed, stats.active) == (1, 1, 0)


def test_remove_cuts_a_connection_still_waiting_for_its_target(
    fwd: TcpForwarder, silent_target: int, port: int
) -> None:
    fwd.ensure(LISTEN, port, "127.0.0.1", silent_target, only(GOOD))
    waiting = connect(port)
    deadline = time.monotonic() + TIMEOUT
    while not fwd.stats()[(LISTEN, port)].active and time.monotonic() < deadline:
        time.sleep(0.005)
    fwd.remove(LISTEN, port)
    assert_closed(waiting)


def test_binding_an_address_in_use_raises(fwd: TcpForwarder, target: EchoServer) -> None:
    with socket.create_server((LISTEN, 0)) as busy:
        taken = busy.getsockname()[1]
        with pytest.raises(RuntimeFailure) as info:
            fwd.ensure(LISTEN, taken, "127.0.0.1", target.port, only(GOOD))
    assert "in use" in info.value.message
    assert info.value.details["listen_port"] == taken
    assert fwd.listeners() == set()


def test_binding_an_address_not_on_this_host_raises(fwd: TcpForwarder, port: int) -> None:
    # 192.0.2.0/24 is TEST-NET-1: never assigned to a local interface.
    with pytest.raises(RuntimeFailure) as info:
        fwd.ensure("192.0.2.1", port, "127.0.0.1", 9, only(GOOD))
    assert "192.0.2.1" in info.value.message
    assert fwd.listeners() == set()


def test_close_resets_everything_and_is_final(target: EchoServer, port: int) -> None:
    fwd = TcpForwarder()
    fwd.ensure(LISTEN, port, "127.0.0.1", target.port, only(GOOD))
    established = connect(port)
    assert echo(established) == b"ping"
    fwd.close()
    assert_closed(established)
    with pytest.raises(ConnectionRefusedError):
        connect(port)
    fwd.close()  # idempotent
    with pytest.raises(RuntimeError):
        fwd.listeners()


def test_bad_ports_are_programming_errors(fwd: TcpForwarder) -> None:
    with pytest.raises(ValueError):
        fwd.ensure(LISTEN, 0, "127.0.0.1", 80, only(GOOD))
    with pytest.raises(ValueError):
        fwd.ensure(LISTEN, 8080, "127.0.0.1", 70000, only(GOOD))
