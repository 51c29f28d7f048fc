"""Who may use a restic repository at once, inside this process.

restic's own locks say the same (a backup or restore takes a shared lock, ``forget`` and
``prune`` an exclusive one), but restic refuses a conflicting lock instead of waiting
for it (0.14 has no ``--retry-lock``): a snapshot started while a prune of a failed
snapshot's data runs would fail with "repository is already locked". The gate lets this
process's backups and restores wait for its own forget to end, and lets a forget go
only when nothing of ours uses the repository (else it is tried again later, as a
refusal by restic would have it). Other processes still meet restic's locks; their
conflicts are waited out where the commands run (storage/volume_restic.py).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator


class RepositoryGate:
    """Shared use (backups, restores) and exclusive use (forget, prune) of each
    repository, keyed by its location."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._users: dict[str, int] = {}
        self._exclusive: set[str] = set()

    @contextlib.contextmanager
    def shared(self, location: str) -> Iterator[None]:
        """Use ``location`` beside other shared users; waits while it is held
        exclusively."""
        with self._changed:
            self._changed.wait_for(lambda: location not in self._exclusive)
            self._users[location] = self._users.get(location, 0) + 1
        try:
            yield
        finally:
            with self._changed:
                self._users[location] -= 1
                if not self._users[location]:
                    del self._users[location]
                self._changed.notify_all()

    @contextlib.contextmanager
    def exclusive(self, location: str) -> Iterator[bool]:
        """Hold ``location`` alone if nobody uses it: yields True then; False (and holds
        nothing) when it is in use, so the caller tries again later. Exclusive holders
        wait for one another."""
        with self._changed:
            self._changed.wait_for(lambda: location not in self._exclusive)
            if self._users.get(location):
                got = False
            else:
                self._exclusive.add(location)
                got = True
        try:
            yield got
        finally:
            if got:
                with self._changed:
                    self._exclusive.discard(location)
                    self._changed.notify_all()
