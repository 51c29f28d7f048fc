"""A userspace TCP forwarder: many listeners served by one asyncio loop in a daemon thread.

Each listener accepts on ``(listen_host, listen_port)`` and pipes every connection it
lets through to ``(target_host, target_port)``. This is what makes a reserved IP or an
allocated host port reach a node container, and what makes security groups real: the
listener's ``acl`` is asked once per accepted connection, before anything is connected
to the target, and again for every open connection when the acl is replaced (a rule
change reaches sessions already established). A denied connection is closed at once
with SO_LINGER 0, so the client sees a reset (as from a firewall's REJECT with
tcp-reset) and the target never sees it.

Threading: every public method may be called from any thread but the forwarder's own,
and returns once its change took effect on the loop. The ``acl`` runs on the loop
thread: it must be quick, must not block and must not call back into the forwarder.
An acl that raises denies the connection (fail closed).

Piping: each direction is backpressured (reading one side pauses while the other's
send buffer is above its high-water mark); a half-close (FIN) is passed on with
``write_eof`` and the other direction keeps flowing until it ends too; a reset on one
side resets the other; a target that cannot be reached resets the client.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar, cast

from gpuyard.core.errors import RuntimeFailure

log = logging.getLogger(__name__)

Acl = Callable[[str, int], bool]
"""``acl(source_ip, listen_port) -> allowed``, asked per accepted connection and, for the
open ones, again whenever the listener's acl is replaced."""

T = TypeVar("T")

# SO_LINGER on, timeout 0: close() drops the connection with a RST instead of a FIN.
_LINGER_RESET = struct.pack("ii", 1, 0)


@dataclass(frozen=True)
class ListenerStats:
    """Counters of one listener since it was first ensured (they survive target and
    acl updates, not a remove)."""

    target: tuple[str, int]
    accepted: int  # let through by the acl
    denied: int  # reset because the acl said no
    failed: int  # let through, but the target could not be reached in time
    active: int  # forwarded connections open now
    bytes_to_target: int
    bytes_to_client: int


class TcpForwarder:
    """Listeners keyed by ``(listen_host, listen_port)`` exactly as given to ``ensure``.

    Use as a context manager, or call ``close()``: it stops every listener, resets every
    connection and joins the loop thread. The thread is a daemon, so a forgotten
    forwarder does not keep the process alive.
    """

    def __init__(
        self,
        *,
        connect_timeout_s: float = 10.0,
        backlog: int = 1024,
        call_timeout_s: float = 30.0,
    ) -> None:
        self._connect_timeout_s = connect_timeout_s
        self._backlog = backlog
        self._call_timeout_s = call_timeout_s
        self._listeners: dict[tuple[str, int], _Listener] = {}  # loop thread only
        # Serialises the public calls with close(), so none is submitted to a stopped loop.
        self._lock = threading.Lock()
        self._closed = False
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="gpuyard-forwarder", daemon=True)
        self._thread.start()

    # -- public API, any thread -------------------------------------------------

    def ensure(
        self,
        listen_host: str,
        listen_port: int,
        target_host: str,
        target_port: int,
        acl: Acl,
    ) -> None:
        """Listen on ``(listen_host, listen_port)`` and forward to the target, or, when
        that listener exists, switch its target and acl in place: connections accepted
        from now on use the new ones; each established connection is asked of the new
        acl and reset if it denies it (one it allows keeps its old target).

        ``listen_host`` is an address (``"0.0.0.0"``, ``"10.1.2.3"``, ``"::"``) or a
        name, resolved here in the caller's thread. The listening socket has
        SO_REUSEADDR. Raises ``RuntimeFailure`` when it cannot be bound (address in use,
        address not assignable on this host, permission denied, unresolvable name).
        """
        _check_port("listen_port", listen_port)
        _check_port("target_port", target_port)
        key = (listen_host, listen_port)
        address = _resolve(listen_host, listen_port)
        self._call(self._ensure(key, address, (target_host, target_port), acl))

    def remove(self, listen_host: str, listen_port: int) -> None:
        """Stop listening on ``(listen_host, listen_port)`` and reset every connection
        that came in through it, so a detached address really stops reaching the
        target. Once this returns the port is closed (a new connect is refused) and the
        reset connections' sockets are closed. Does nothing for an unknown listener."""
        self._call(self._remove((listen_host, listen_port)))

    def listeners(self) -> set[tuple[str, int]]:
        """The ``(listen_host, listen_port)`` keys listening now."""
        return self._call(self._keys())

    def stats(self) -> dict[tuple[str, int], ListenerStats]:
        """A consistent snapshot of every listener's counters."""
        return self._call(self._stats())

    def close(self) -> None:
        """Remove every listener (resetting its connections), stop the loop and join its
        thread. Idempotent; any other call afterwards raises ``RuntimeError``."""
        with self._lock:
            if self._closed:
                return
            self._check_thread()
            self._closed = True
            try:
                self._submit(self._shutdown())
            finally:
                self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(self._call_timeout_s)

    def __enter__(self) -> TcpForwarder:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- plumbing ---------------------------------------------------------------

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_forever()
        finally:
            # Aborted transports close their sockets in callbacks: let those run.
            self._loop.run_until_complete(asyncio.sleep(0))
            self._loop.close()

    def _check_thread(self) -> None:
        # Waiting on the loop from the loop's own thread would never return.
        if threading.get_ident() == self._thread.ident:
            raise RuntimeError("TcpForwarder must not be called from its own loop (an acl?)")

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        with self._lock:
            if self._closed:
                coro.close()
                raise RuntimeError("TcpForwarder is closed")
            try:
                self._check_thread()
            except RuntimeError:
                coro.close()
                raise
            return self._submit(coro)

    def _submit(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(self._call_timeout_s)

    # -- loop thread ------------------------------------------------------------

    async def _ensure(
        self,
        key: tuple[str, int],
        address: tuple[int, tuple[Any, ...]],
        target: tuple[str, int],
        acl: Acl,
    ) -> None:
        existing = self._listeners.get(key)
        if existing is not None:
            existing.target = target
            existing.acl = acl
            for pipe in list(existing.pipes):
                if not existing.allows(pipe.source):
                    log.debug("acl change: resetting %s -> %s:%d", pipe.source, *key)
                    pipe.reset()
            return
        listener = _Listener(key, target, acl, self._connect_timeout_s)
        sock = _bind(key, *address)
        try:
            listener.server = await asyncio.get_running_loop().create_server(
                listener.protocol, sock=sock, backlog=self._backlog
            )
        except OSError as exc:
            sock.close()
            raise _bind_failure(key, exc) from exc
        self._listeners[key] = listener

    async def _remove(self, key: tuple[str, int]) -> None:
        listener = self._listeners.pop(key, None)
        if listener is not None:
            listener.close()
            # One loop turn runs the aborted transports' callbacks, which close their
            # sockets: the caller gets control back with the connections really gone.
            await asyncio.sleep(0)

    async def _keys(self) -> set[tuple[str, int]]:
        return set(self._listeners)

    async def _stats(self) -> dict[tuple[str, int], ListenerStats]:
        return {key: listener.stats() for key, listener in self._listeners.items()}

    async def _shutdown(self) -> None:
        for key in list(self._listeners):
            await self._remove(key)
        # Connects still in flight: cancel them and let them clean up their sockets.
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class _Listener:
    """One listening socket, its current target and acl, its live pipes and counters.
    Touched only on the loop thread."""

    def __init__(
        self, key: tuple[str, int], target: tuple[str, int], acl: Acl, connect_timeout_s: float
    ) -> None:
        self.key = key
        self.target = target
        self.acl = acl
        self.connect_timeout_s = connect_timeout_s
        self.server: asyncio.Server | None = None
        self.closed = False
        self.pipes: set[_Pipe] = set()
        self.accepted = 0
        self.denied = 0
        self.failed = 0
        self.bytes_to_target = 0
        self.bytes_to_client = 0

    def allows(self, source: str) -> bool:
        """Whether the acl lets ``source`` in; an acl that raises denies (fail closed)."""
        try:
            return bool(self.acl(source, self.key[1]))
        except Exception:
            log.exception("acl of %s:%d failed for %s; denying", *self.key, source)
            return False

    def protocol(self) -> asyncio.Protocol:
        """The server's protocol factory: each accepted connection is a new pipe."""
        return _Pipe(self).client

    def close(self) -> None:
        self.closed = True
        if self.server is not None:
            # Closes the listening socket now: new connects are refused from here on.
            self.server.close()
        for pipe in list(self.pipes):
            pipe.reset()

    def stats(self) -> ListenerStats:
        return ListenerStats(
            target=self.target,
            accepted=self.accepted,
            denied=self.denied,
            failed=self.failed,
            active=len(self.pipes),
            bytes_to_target=self.bytes_to_target,
            bytes_to_client=self.bytes_to_client,
        )


class _Pipe:
    """One forwarded connection: the client side, accepted by a listener, and the
    target side, connected only once the acl let the client through."""

    def __init__(self, listener: _Listener) -> None:
        self.listener = listener
        self.client = _Side(self)
        self.target: _Side | None = None
        self.connect_task: asyncio.Task[None] | None = None
        self.source = ""  # the client's address, once accepted

    def made(self, side: _Side, transport: asyncio.Transport) -> None:
        if side is self.client:
            self._accepted(transport)
        else:
            self._linked(side, transport)

    def _accepted(self, transport: asyncio.Transport) -> None:
        listener = self.listener
        peer = transport.get_extra_info("peername")
        source = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        self.source = source
        if listener.closed:
            # Accepted by the kernel just before remove(): it must not get through.
            _reset(transport)
            return
        if not listener.allows(source):
            listener.denied += 1
            log.debug("denied %s -> %s:%d", source, *listener.key)
            _reset(transport)
            return
        listener.accepted += 1
        listener.pipes.add(self)
        # Nothing is read from the client until the target is connected: the bytes would
        # have nowhere to go, and the kernel's receive buffer is the right backpressure.
        transport.pause_reading()
        self.connect_task = asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        host, port = self.listener.target
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.listener.connect_timeout_s):
                await loop.create_connection(lambda: _Side(self), host, port)
        except (OSError, TimeoutError) as exc:
            self.listener.failed += 1
            log.info(
                "%s:%d -> %s:%d unreachable: %s",
                *self.listener.key,
                host,
                port,
                str(exc) or "timed out",
            )
            # Reset, as the client would have seen connecting to a refusing target itself.
            if self.client.transport is not None:
                _reset(self.client.transport)

    def _linked(self, target: _Side, transport: asyncio.Transport) -> None:
        self.target = target
        client = self.client
        if client.lost or client.transport is None or client.transport.is_closing():
            transport.abort()
            return
        client.peer = target
        target.peer = client
        client.transport.resume_reading()

    def lost(self, side: _Side, exc: Exception | None) -> None:
        other = self.target if side is self.client else self.client
        if side is self.client and self.connect_task is not None:
            self.connect_task.cancel()  # no-op once the connect finished
        if other is not None and other.transport is not None and not other.lost:
            if exc is None:
                other.transport.close()  # graceful: what is buffered still goes out
            else:
                _reset(other.transport)
        if self.client.lost and (self.target is None or self.target.lost):
            self.listener.pipes.discard(self)

    def reset(self) -> None:
        if self.connect_task is not None:
            self.connect_task.cancel()
        for side in (self.client, self.target):
            if side is not None and side.transport is not None and not side.lost:
                _reset(side.transport)

    def count(self, side: _Side, n: int) -> None:
        if side is self.client:
            self.listener.bytes_to_target += n
        else:
            self.listener.bytes_to_client += n


class _Side(asyncio.Protocol):
    """One socket of a pipe; whatever it reads is written to its peer."""

    def __init__(self, pipe: _Pipe) -> None:
        self.pipe = pipe
        self.transport: asyncio.Transport | None = None
        self.peer: _Side | None = None
        self.got_eof = False
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.pipe.made(self, self.transport)

    def data_received(self, data: bytes) -> None:
        # Reading starts only once both sides are linked, so the peer is there.
        peer = self.peer
        if peer is not None and peer.transport is not None:
            peer.transport.write(data)
            self.pipe.count(self, len(data))

    def eof_received(self) -> bool:
        self.got_eof = True
        peer = self.peer
        if peer is None or peer.transport is None:
            return False
        if peer.got_eof:
            # Both directions are finished: close both once their buffers drained.
            peer.transport.close()
            return False
        # Half-close: pass the FIN on, keep the other direction flowing.
        peer.transport.write_eof()
        return True

    def pause_writing(self) -> None:
        # Our send buffer is full: stop reading from the side that fills it. Not once
        # that side is at EOF: resuming it later would re-arm a finished reader.
        peer = self.peer
        if peer is not None and peer.transport is not None and not peer.got_eof:
            peer.transport.pause_reading()

    def resume_writing(self) -> None:
        peer = self.peer
        if peer is not None and peer.transport is not None and not peer.got_eof:
            peer.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.pipe.lost(self, exc)


def _reset(transport: asyncio.Transport) -> None:
    """Close ``transport`` at once with a RST, dropping whatever is still buffered."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        # Fails (EBADF) only when the socket is already closed: nothing left to reset.
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
    transport.abort()


def _check_port(name: str, port: int) -> None:
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError(f"{name} must be an integer in 1..65535, got {port!r}")


def _resolve(host: str, port: int) -> tuple[int, tuple[Any, ...]]:
    """The socket family and address to bind for ``host``: the first answer of
    getaddrinfo, which for an address literal is that address."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as exc:
        raise _bind_failure((host, port), exc) from exc
    family, _, _, _, address = infos[0]
    return int(family), tuple(address)


def _bind(key: tuple[str, int], family: int, address: tuple[Any, ...]) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        # A port freed by a remove() is bindable again at once, despite TIME_WAIT.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise _bind_failure(key, exc) from exc
    return sock


def _bind_failure(key: tuple[str, int], exc: Exception) -> RuntimeFailure:
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    details: dict[str, Any] = {"listen_host": key[0], "listen_port": key[1]}
    if isinstance(exc, OSError) and exc.errno is not None:
        details["errno"] = exc.errno
    return RuntimeFailure(f"cannot listen on {key[0]}:{key[1]}: {reason}", details)
