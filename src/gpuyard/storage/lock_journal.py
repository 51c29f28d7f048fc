"""Which restic locks each REST backend server (storage/rest_server.py) placed, kept on
disk, so that the locks of a server that died without deleting them can be removed.

A server deletes the locks restic left when it ends, on its stdin's end or SIGTERM.
A server that cannot (SIGKILL: a service manager killing the control plane's whole
group, the kernel's OOM killer) leaves them, and ``restic unlock`` does not remove
them: they name the helper container's host name and PID, so restic cannot tell that
their process is gone, and calls them stale only after 30 minutes. Every exclusive
operation on the repository (a prune, a check, a forget) is refused until then.

So each server keeps a journal in the repository's directory: ``.gy-locks-<token>``,
one lock name per line, each written before its lock is placed. The server holds an
exclusive ``flock`` on its journal for its whole life; the kernel drops it when the
process ends, however it ends. A journal whose ``flock`` can be taken belongs to a
server that is gone, so its locks are stale: :func:`remove_orphaned_locks` deletes
them and the journal. A journal is made under a temporary name and renamed once
locked, so it is never seen unlocked while its server lives. (restic ignores files in
the repository's top directory that are not its own, as it does the servers'
temporary uploads.)
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import time
from pathlib import Path
from typing import Final

JOURNAL_PREFIX: Final = ".gy-locks-"
_MAKING_PREFIX: Final = ".gy-making-locks-"
# A journal still under its temporary name this long after it was made belongs to a
# server that died within that step (it takes microseconds): it holds no names.
_MAKING_LEFTOVER_S: Final = 60.0


class LockJournal:
    """One server's journal in repository ``root``, locked while this object is open.
    :meth:`note` each lock name before placing the lock; :meth:`close` when the locks
    are deleted (removes the journal)."""

    def __init__(self, root: Path) -> None:
        token = secrets.token_hex(8)
        making = root / f"{_MAKING_PREFIX}{token}"
        self.path = root / f"{JOURNAL_PREFIX}{token}"
        fd = os.open(making, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.rename(making, self.path)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(making)
            raise
        self._fd: int | None = fd

    def note(self, name: str) -> None:
        """Record lock ``name`` (call before the lock is placed). Not synced: the
        journal has to outlive its process, not the machine (a reboot ends every
        helper, and restic's 30 minutes end its locks)."""
        if self._fd is None:
            raise ValueError("the journal is closed")
        os.write(self._fd, name.encode() + b"\n")

    def close(self) -> None:
        """Remove the journal (its locks are deleted). Idempotent."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        os.close(fd)


def remove_orphaned_locks(root: Path) -> list[str]:
    """Delete the locks in repository ``root`` that servers now gone placed, and their
    journals; a live server's journal (locked) is left alone. Returns the lock names
    deleted. A missing repository has none."""
    removed: list[str] = []
    try:
        found = list(root.iterdir())
    except FileNotFoundError:
        return removed
    cutoff = time.time() - _MAKING_LEFTOVER_S
    for making in (p for p in found if p.name.startswith(_MAKING_PREFIX)):
        with contextlib.suppress(FileNotFoundError):
            if making.lstat().st_mtime < cutoff:
                making.unlink()
    entries = sorted(p for p in found if p.name.startswith(JOURNAL_PREFIX))
    for journal in entries:
        try:
            fd = os.open(journal, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except FileNotFoundError:
            continue  # its server just ended and removed it
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # its server lives
            with os.fdopen(os.dup(fd), "rb") as f:
                names = f.read().decode("ascii", "replace").split()
            for name in names:
                if _is_lock_name(name):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(root / "locks" / name)
                        removed.append(name)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(journal)
        finally:
            os.close(fd)
    return removed


def _is_lock_name(name: str) -> bool:
    """restic names a lock by its content's SHA-256 (64 hex digits): nothing else in a
    journal may lead outside ``locks/``."""
    return len(name) == 64 and all(c in "0123456789abcdef" for c in name)
