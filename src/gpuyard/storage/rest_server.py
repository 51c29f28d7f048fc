"""A restic REST backend for ONE repository directory, for ONE operation, run as a child
process of the control plane (``python -m gpuyard.storage.rest_server``; started and
stopped by storage/rest_process.py).

Why: restic runs inside a helper container that mounts only the volume it reads or
writes and the restic binary (storage/volume_restic.py); it reaches the repository only
through this server, never through a path, so nothing a tenant's symlinks in the volume
point at can be the repository, its password file or the server's home.

The child reads one JSON document from its stdin (it is never on a command line):
``root`` (the repository directory), ``user`` and ``password`` (the one-time HTTP basic
credential), ``mode`` (storage/rest_objects.py Mode), ``keys`` (name -> base64 of a key
file made for this operation: the only keys served), ``port``, and ``control_fd``, a
unix socket on which one message then says to listen, with the helper's network
namespace as a passed file descriptor: the child enters it before it binds
``127.0.0.1:port``. A socket made after ``setns`` belongs to that namespace, so
only processes in the helper's namespace can connect; nothing listens on the host.
It then prints ``listening <port>`` and serves until its stdin ends (the operation is
over), SIGTERM or SIGINT: then it stops answering, deletes the locks it created that
restic left behind (a helper killed mid-way) and exits. Its parent's death sends it
SIGTERM (storage/child_process.py), so it cleans up then too. Killed with SIGKILL, it
cannot: each lock's name is journaled before the lock is placed, and the next server
on the repository, or gpuyard's unlock, removes what it left (storage/lock_journal.py).

Every request is checked in this order, each refusal answered with a status and no
effect: the credential (401), the path and object name (storage/rest_objects.py:
400/404), the operation's policy (403/405). Uploads are read to a temporary file beside
the repository's objects, their SHA-256 checked against their name (400 otherwise),
and linked into place without replacing anything. Downloads honour ``Range`` and are
sent with ``sendfile``.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import errno
import hashlib
import json
import os
import secrets
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Final

from gpuyard.storage.lock_journal import LockJournal, remove_orphaned_locks
from gpuyard.storage.rest_objects import (
    KINDS,
    LISTEN_HERE,
    LISTEN_IN,
    Mode,
    Policy,
    Refused,
    Target,
    open_directory_below,
    open_object,
    open_parent,
    parse_path,
)

_CLONE_NEWNET: Final = 0x40000000
_UPLOAD_PREFIX: Final = ".gy-upload-"
# An upload's temporary file older than this is a leftover of a server that was killed.
UPLOAD_LEFTOVER_S: Final = 3600.0
# The largest object accepted: restic 0.14's packs are 4-16 MiB (128 MiB at most).
MAX_OBJECT_BYTES: Final = 1 << 30
_V2: Final = "application/vnd.x.restic.rest.v2"
_READ_CHUNK: Final = 1 << 20


class RepositoryState:
    """What the handlers share: the repository, the credential, the policy, the keys
    served, and the locks created (so only those may be deleted, and leftovers go)."""

    def __init__(
        self,
        root: Path,
        user: str,
        password: str,
        mode: Mode,
        keys: dict[str, bytes],
        journal: LockJournal | None = None,
    ) -> None:
        self.root = root
        # Where each lock's name goes before the lock does (storage/lock_journal.py),
        # so a server killed with SIGKILL leaves locks others can remove.
        self._journal = journal
        self.policy = Policy(mode)
        self.keys = keys
        self._authorization = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        self._lock = threading.Lock()
        self._created_locks: set[str] = set()
        self._closed = False

    def authorized(self, header: str | None) -> bool:
        if self._closed or header is None:
            return False
        return secrets.compare_digest(header.encode(), self._authorization.encode())

    def place_lock(self, name: str, place: Callable[[], None]) -> bool:
        """Put lock ``name`` in place (``place``) and note it as this server's, as one
        step against :meth:`close`: a lock is either placed and known, so close()
        deletes it, or, once closed, never placed (False). (Placed first and noted
        after, a server ending in between left a lock no one would delete.)"""
        with self._lock:
            if self._closed:
                return False
            if self._journal is not None:
                self._journal.note(name)
            place()
            self._created_locks.add(name)
            return True

    def lock_deleted(self, name: str) -> bool:
        """Whether this server created lock ``name`` (and forgets it)."""
        with self._lock:
            if name not in self._created_locks:
                return False
            self._created_locks.discard(name)
            return True

    def close(self) -> list[str]:
        """Refuse every request from now on and delete the locks created and not
        deleted. Returns their names."""
        with self._lock:
            self._closed = True
            left = sorted(self._created_locks)
            self._created_locks.clear()
        for name in left:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.root / "locks" / name)
        if self._journal is not None:
            self._journal.close()
        return left


class Handler(BaseHTTPRequestHandler):
    """restic's REST protocol on one :class:`RepositoryState` (``server.state``)."""

    protocol_version = "HTTP/1.1"
    server_version = "gpuyard-rest"
    sys_version = ""

    def setup(self) -> None:
        super().setup()
        # Headers and body go in separate writes: without this, Nagle's algorithm and
        # the client's delayed ACK hold every small answer back ~40 ms.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    @property
    def state(self) -> RepositoryState:
        state: RepositoryState = self.server.state  # type: ignore[attr-defined]
        return state

    def log_message(self, format: str, *args: Any) -> None:
        """Requests are not logged (a backup makes thousands)."""

    def do_HEAD(self) -> None:
        self._serve("HEAD")

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def _serve(self, method: str) -> None:
        self._body_taken = False  # whether this request's body has left the connection
        try:
            if not self.state.authorized(self.headers.get("Authorization")):
                raise Refused(401, "unauthorized")
            target = parse_path(self.path)
            self.state.policy.check(method, target)
            if method in ("GET", "HEAD"):
                self._read(method, target)
            elif method == "POST":
                self._save(target)
            elif method == "DELETE":
                self._delete(target)
            else:
                raise Refused(405, "method not allowed")
        except Refused as exc:
            # Whatever was refused (credential, name, method, policy, length), the body
            # it came with must not be read as the next request on the connection.
            if not self._body_taken:
                self._discard_body()
            self._answer(exc.status, exc.reason.encode())
        except OSError as exc:
            if isinstance(exc, (BrokenPipeError, ConnectionResetError)):
                self.close_connection = True
                return
            self._answer(500, b"storage error")

    # -- reading -------------------------------------------------------------------

    def _read(self, method: str, target: Target) -> None:
        if target.is_listing:
            self._list(method, target.kind)
            return
        if target.kind == "keys":
            assert target.name is not None
            data = self.state.keys.get(target.name)
            if data is None:
                raise Refused(404, "not found")
            self._answer(200, data, body=method == "GET")
            return
        try:
            fd = open_object(self.state.root, target)
        except OSError as exc:
            # Missing, or a symlink planted in the repository for the object or for a
            # directory above it (ELOOP, ENOTDIR): not an object.
            if exc.errno in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR):
                raise Refused(404, "not found") from None
            raise
        try:
            size = os.fstat(fd).st_size
            start, length = self._range(size)
            self.send_response(206 if length != size or start else 200)
            self.send_header("Content-Length", str(length))
            if start or length != size:
                self.send_header("Content-Range", f"bytes {start}-{start + length - 1}/{size}")
            self.end_headers()
            if method == "GET":
                self._send_file(fd, start, length)
        finally:
            os.close(fd)

    def _range(self, size: int) -> tuple[int, int]:
        """(offset, length) of a ``Range: bytes=a-b`` or ``bytes=a-`` header (the whole
        object without one). 416 for one outside the object."""
        header = self.headers.get("Range")
        if header is None:
            return 0, size
        spec = header.removeprefix("bytes=")
        first, sep, last = spec.partition("-")
        if not sep or not first.isdigit() or (last and not last.isdigit()):
            raise Refused(416, "unsupported range")
        start = int(first)
        end = min(int(last), size - 1) if last else size - 1
        if start >= size or end < start:
            raise Refused(416, "range outside the object")
        return start, end - start + 1

    def _send_file(self, fd: int, start: int, length: int) -> None:
        self.wfile.flush()
        out = self.connection.fileno()
        offset, left = start, length
        while left > 0:
            sent = os.sendfile(out, fd, offset, left)
            if sent == 0:
                raise BrokenPipeError("the object ended early")
            offset += sent
            left -= sent

    def _list(self, method: str, kind: str) -> None:
        if kind == "keys":
            entries = [(name, len(data)) for name, data in sorted(self.state.keys.items())]
        else:
            entries = list(_listing(self.state.root, kind))
        v2 = _V2 in (self.headers.get("Accept") or "")
        doc: list[Any] = (
            [{"name": n, "size": s} for n, s in entries] if v2 else [n for n, _ in entries]
        )
        body = json.dumps(doc).encode()
        self._answer(200, body, body=method == "GET", content_type=_V2 if v2 else None)

    # -- writing -------------------------------------------------------------------

    def _save(self, target: Target) -> None:
        assert target.name is not None
        length_header = self.headers.get("Content-Length")
        if length_header is None or not length_header.isdigit():
            raise Refused(411, "a length is required")
        length = int(length_header)
        if length > MAX_OBJECT_BYTES:
            self.close_connection = True
            raise Refused(413, "object too large")
        tmp = self.state.root / f"{_UPLOAD_PREFIX}{secrets.token_hex(8)}"
        digest = hashlib.sha256()
        # From here the body is read to its end, or the connection closed.
        self._body_taken = True
        try:
            with open(tmp, "xb") as f:
                left = length
                while left > 0:
                    chunk = self.rfile.read(min(left, _READ_CHUNK))
                    if not chunk:
                        self.close_connection = True
                        raise Refused(400, "the upload ended early")
                    digest.update(chunk)
                    f.write(chunk)
                    left -= len(chunk)
                if digest.hexdigest() != target.name:
                    raise Refused(400, "the content does not match its name")
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o400)  # as restic's local backend leaves its files
            # Into its directory as opened without following links (one planted for
            # data/xx must not take the object elsewhere). Never replaces: an object
            # of this name exists already with the same content (the name is its
            # checked hash), so there is nothing to do.
            parent, name = self._parent_of(target, create=True)

            def place() -> None:
                with contextlib.suppress(FileExistsError):
                    os.link(tmp, name, dst_dir_fd=parent)

            try:
                if target.kind != "locks":
                    place()
                elif not self.state.place_lock(target.name, place):
                    # Written while the operation ended: no lock may outlive it.
                    raise Refused(403, "the operation is over")
            finally:
                os.close(parent)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        self._answer(200, b"")

    def _parent_of(self, target: Target, *, create: bool = False) -> tuple[int, str]:
        """``target``'s directory (open) and name (rest_objects.open_parent); a link
        planted in the repository's path to it refuses the request."""
        try:
            return open_parent(self.state.root, target, create=create)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise Refused(404, "not found") from None
            raise

    def _delete(self, target: Target) -> None:
        assert target.name is not None
        # Only locks reach here (Policy), and only the ones this server made go.
        if not self.state.lock_deleted(target.name):
            raise Refused(403, "not a lock of this operation")
        try:
            parent, name = self._parent_of(target)
        except FileNotFoundError:  # no locks/ at all: nothing to delete
            self._answer(200, b"")
            return
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=parent)
        finally:
            os.close(parent)
        self._answer(200, b"")

    # -- answers -------------------------------------------------------------------

    def _answer(
        self, status: int, data: bytes, *, body: bool = True, content_type: str | None = None
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        if content_type is not None:
            self.send_header("Content-Type", content_type)
        self.end_headers()
        if body and data and self.command != "HEAD":
            self.wfile.write(data)

    def _discard_body(self) -> None:
        """Read a refused request's body off the connection (small ones), so the next
        request on it parses; a large one closes the connection instead."""
        self._body_taken = True
        length = self.headers.get("Content-Length")
        if self.headers.get("Transfer-Encoding"):
            self.close_connection = True  # never parsed here: where it ends is unknown
        elif length and length.isdigit() and int(length) <= _READ_CHUNK:
            self.rfile.read(int(length))
        elif length and length != "0":
            self.close_connection = True


def _listing(root: Path, kind: str) -> list[tuple[str, int]]:
    """(name, size) of every object of ``kind``; names that are not an object's (our
    temporary files, anything else) are left out, and so is any directory reached
    through a symlink (one planted for ``data/xx`` lists nothing from elsewhere)."""
    assert kind in KINDS
    found: list[tuple[str, int]] = []
    top = _open_below(os.open(root, os.O_RDONLY | os.O_DIRECTORY), kind)
    if top is None:
        return found
    try:
        if kind != "data":
            _scan(top, found)
            return found
        for name in sorted(os.listdir(top)):
            sub = _open_below(os.dup(top), name) if len(name) == 2 else None
            if sub is not None:
                try:
                    _scan(sub, found)
                finally:
                    os.close(sub)
        return found
    finally:
        os.close(top)


def _open_below(parent: int, name: str) -> int | None:
    """Directory ``name`` in the open directory ``parent`` (which this closes), opened
    without following a link; None when it is missing or not a plain directory."""
    try:
        return open_directory_below(parent, name)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return None
        raise
    finally:
        os.close(parent)


def _scan(directory: int, found: list[tuple[str, int]]) -> None:
    """Append the objects (plain files with a 64-hex lower-case name) of the open
    ``directory``."""
    with os.scandir(directory) as entries:
        for entry in entries:
            if entry.is_file(follow_symlinks=False) and len(entry.name) == 64:
                with contextlib.suppress(ValueError):
                    int(entry.name, 16)
                    if entry.name == entry.name.lower():
                        found.append((entry.name, entry.stat(follow_symlinks=False).st_size))


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], state: RepositoryState) -> None:
        self.state = state
        super().__init__(address, Handler)


def sweep_uploads(root: Path, older_than_s: float = UPLOAD_LEFTOVER_S) -> list[str]:
    """Remove the temporary files of uploads cut off by a server killed mid-upload
    (older than ``older_than_s``: another operation's server on the same repository
    may be writing its own right now). Returns their names."""
    gone: list[str] = []
    cutoff = time.time() - older_than_s
    with contextlib.suppress(FileNotFoundError), os.scandir(root) as entries:
        for entry in entries:
            if not entry.name.startswith(_UPLOAD_PREFIX) or not entry.is_file(
                follow_symlinks=False
            ):
                continue
            with contextlib.suppress(FileNotFoundError):
                if entry.stat(follow_symlinks=False).st_mtime < cutoff:
                    os.unlink(entry.path)
                    gone.append(entry.name)
    return gone


def enter_netns(fd: int) -> None:
    """Move this thread into the network namespace open on ``fd`` (setns(2))."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, _CLONE_NEWNET) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"setns: {os.strerror(code)}")


def serve(config: dict[str, Any], netns_fd: int | None) -> Server:
    """Make the server ``config`` describes (see the module docstring), bound (in the
    network namespace open on ``netns_fd``, when given) and ready to serve; the caller
    runs ``serve_forever``."""
    if netns_fd is not None:
        enter_netns(netns_fd)
        os.close(netns_fd)
    root = Path(config["root"])
    sweep_uploads(root)
    # Locks a killed server of an earlier operation left would refuse this one's restic.
    remove_orphaned_locks(root)
    state = RepositoryState(
        root,
        str(config["user"]),
        str(config["password"]),
        Mode(config["mode"]),
        {str(k): base64.b64decode(v) for k, v in (config.get("keys") or {}).items()},
        LockJournal(root),
    )
    return Server((str(config.get("host", "127.0.0.1")), int(config.get("port", 0))), state)


def wait_for_end(stdin_fd: int, wake_fd: int) -> None:
    """Return once ``stdin_fd`` ends (the operation is over, or the parent is gone) or
    a byte arrives on ``wake_fd`` (a signal)."""
    while True:
        ready, _, _ = select.select([stdin_fd, wake_fd], [], [])
        if wake_fd in ready:
            return
        try:
            if not os.read(stdin_fd, 4096):
                return
        except OSError:
            return


def main() -> int:
    config = json.loads(sys.stdin.readline())
    control = socket.socket(fileno=int(config["control_fd"]))
    message, fds, _flags, _addr = socket.recv_fds(control, 64, 1)
    control.close()
    if message == LISTEN_IN and len(fds) == 1:
        netns_fd: int | None = fds[0]
    elif message == LISTEN_HERE and not fds:
        netns_fd = None
    else:
        # The parent went away, or its helper was never made: never fall back to
        # listening in this (the host's) namespace.
        for fd in fds:
            os.close(fd)
        print("not told where to listen", file=sys.stderr, flush=True)
        return 1
    server = serve(config, netns_fd)
    # The signals only wake the main thread through a pipe: a handler that set a
    # threading.Event could run while this thread holds that event's own lock (just
    # woken by the stdin's end) and wait on it for ever, leaving restic's locks.
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    signal.signal(signal.SIGINT, lambda signum, frame: None)
    # A short poll: the operation's end waits for serve_forever to notice the shutdown.
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.02}, name="rest", daemon=True
    ).start()
    print(f"listening {server.server_address[1]}", flush=True)
    wait_for_end(sys.stdin.fileno(), wake_r)
    left = server.state.close()
    server.shutdown()
    with contextlib.suppress(OSError):
        server.socket.shutdown(socket.SHUT_RDWR)
    server.server_close()
    print(json.dumps({"locks_removed": left}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
