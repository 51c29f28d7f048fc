"""What the REST backend server (storage/rest_server.py) lets one operation do with one
restic repository: the request paths it understands, the object names it accepts and
where each object lives on disk. Pure functions; the server applies them to every
request before it touches a file.

restic's REST protocol (v1 and v2) names objects ``/config`` and ``/<kind>/<name>``
with ``kind`` one of ``data``, ``keys``, ``locks``, ``snapshots``, ``index``, and lists
a kind with ``GET /<kind>/``. Every object but ``config`` is named by the SHA-256 of
its content, so a name is exactly 64 lower-case hex digits: anything else (``..``,
``/``, percent-escapes, upper case, a query string other than restic's own) is refused
before a path is built, and the path is built from the validated parts only, under the
repository's root (the local backend's layout: ``data/<first two digits>/<name>``).

What an operation may do (:class:`Policy`):

* ``config``: read only (never created or replaced: the control plane made the
  repository).
* ``keys``: read only, and only the keys the server was given (one key made for this
  operation, never written to disk); the repository's own keys are not listed or read.
* ``locks``: read and list all (restic looks for exclusive locks), create, and delete
  only those this server created.
* ``data``, ``index``, ``snapshots``: read and list; a backup may also add objects
  (never replace or delete one); a restore adds nothing.
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Final

KINDS: Final = ("data", "keys", "locks", "snapshots", "index")
_NAME: Final = re.compile(r"[0-9a-f]{64}")
# restic asks for the repository to be made with POST /?create=true: always refused.
_CREATE_QUERY: Final = "create=true"

# What the child is told over the control socket: listen in the namespace whose fd
# comes with the message, or (tests) in its own. Anything else (the socket closed: the
# helper was never made) and it exits without listening anywhere.
LISTEN_IN: Final = b"listen\n"
LISTEN_HERE: Final = b"listen here\n"


class Mode(StrEnum):
    """What the operation does with the repository."""

    BACKUP = "backup"  # reads, and adds objects
    RESTORE = "restore"  # reads (and takes a lock)


class Refused(Exception):
    """A request the server answers with ``status`` and does nothing for."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


@dataclass(frozen=True)
class Target:
    """A parsed request path: ``kind`` is ``config``, one of :data:`KINDS`, or ``""``
    for the repository root; ``name`` is None for the root, ``config`` and a listing."""

    kind: str
    name: str | None = None

    @property
    def is_listing(self) -> bool:
        return self.kind in KINDS and self.name is None


def valid_name(name: str) -> bool:
    """Whether ``name`` can name a restic object: 64 lower-case hex digits."""
    return _NAME.fullmatch(name) is not None


def parse_path(raw: str) -> Target:
    """The target of a request for ``raw`` (the request line's path, query included).
    Raises Refused (400 for a name that is not an object's, 404 for a path restic never
    asks for)."""
    path, _, query = raw.partition("?")
    if query and not (path == "/" and query == _CREATE_QUERY):
        raise Refused(400, "unexpected query string")
    if path == "/":
        return Target("")
    if path == "/config":
        return Target("config")
    parts = path.split("/")
    # "/kind/" -> ["", kind, ""]; "/kind/name" -> ["", kind, name]
    if len(parts) != 3 or parts[0] != "" or parts[1] not in KINDS:
        raise Refused(404, "no such path")
    kind, name = parts[1], parts[2]
    if name == "":
        return Target(kind)
    if not valid_name(name):
        raise Refused(400, "invalid object name")
    return Target(kind, name)


def object_path(root: Path, target: Target) -> Path:
    """Where ``target`` (``config`` or a named object) lives under the repository root
    ``root``; built from validated parts only."""
    if target.kind == "config":
        return root / "config"
    if target.kind not in KINDS or target.name is None or not valid_name(target.name):
        raise Refused(400, "not an object")
    if target.kind == "data":
        return root / "data" / target.name[:2] / target.name
    return root / target.kind / target.name


def open_directory_below(parent: int, name: str) -> int:
    """Directory ``name`` in the open directory ``parent``, open (an fd the caller
    closes), not followed through a symlink: a link or a file there raises OSError
    (ELOOP or ENOTDIR), a missing one FileNotFoundError."""
    return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent)


def open_parent(root: Path, target: Target, *, create: bool = False) -> tuple[int, str]:
    """The directory holding ``target``'s file under ``root``, open (an fd the caller
    closes), and the file's name in it. Every component below the root is opened
    without following a symlink (a link planted for a directory: OSError ELOOP or
    ENOTDIR); ``create`` makes a missing one (0700), as an upload into a new
    ``data/xx`` needs."""
    parts = object_path(root, target).relative_to(root).parts
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in parts[:-1]:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o700, dir_fd=fd)
            below = open_directory_below(fd, part)
            os.close(fd)
            fd = below
    except BaseException:
        os.close(fd)
        raise
    return fd, parts[-1]


def open_object(root: Path, target: Target) -> int:
    """``target``'s file under ``root``, open for reading, no component below the root
    followed through a symlink (the object itself neither): see :func:`open_parent`."""
    fd, name = open_parent(root, target)
    try:
        return os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=fd)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Policy:
    """What one operation may do (see the module docstring)."""

    mode: Mode

    def check(self, method: str, target: Target) -> None:
        """Raise Refused unless ``method`` on ``target`` is allowed. Deleting a lock is
        allowed here; the server still checks that it made that lock."""
        reading = method in ("GET", "HEAD")
        if target.kind == "":
            raise Refused(403, "the repository exists already")
        if target.kind == "config" or target.kind == "keys":
            if reading:
                return
            raise Refused(403, f"{target.kind} is read-only")
        if reading:
            return
        if target.name is None:
            raise Refused(405, "a listing is read-only")
        if target.kind == "locks" and method in ("POST", "DELETE"):
            return
        if method == "POST" and self.mode == Mode.BACKUP:
            return
        if method == "DELETE":
            raise Refused(403, f"{target.kind} objects are never deleted here")
        if method == "POST":
            raise Refused(403, "a restore adds nothing to the repository")
        raise Refused(405, "method not allowed")
