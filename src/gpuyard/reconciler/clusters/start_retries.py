"""A start the engine fails at one of its own steps is tried again before ``error``.

A container engine under load fails a step now and then for reasons of its own (a
Podman 500 while its database is busy, a network backend that lost a lock race): the
same create or start succeeds a second later. A cluster must not end in ``error`` for
that. So the engine steps of a start (create, start, the readiness check) get
:data:`ATTEMPTS` tries, the next one no sooner than 1 s, then 2 s, … after a failure;
the cluster stays ``starting`` meanwhile. A failure that is the user's (the image, the
command, a secret that cannot be opened) costs those seconds too, and then ends in
``error`` with the engine's last words, as before. The host refusing a limit or a disk
size it cannot enforce (:func:`host_refusal`) ends it at once.

The count is kept in memory per replica: a restart of the server gives a start its
tries again, which is what a start after a crash would need anyway.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import datetime, timedelta

from gpuyard.core.errors import RuntimeFailure

ATTEMPTS = 3
FIRST_DELAY_S = 1.0


def host_refusal(exc: RuntimeFailure) -> bool:
    """Whether ``exc`` is the host refusing what the cluster asks of it for good (CPU/
    memory limits or a disk size its engine cannot enforce): no later attempt differs,
    so none is made."""
    return exc.details.get("enforces_disk") is False or exc.details.get("enforces_limits") is False


class StartRetries:
    """Failed engine steps of starts, per cluster id. Thread-safe."""

    def __init__(
        self,
        now: Callable[[], datetime],
        attempts: int = ATTEMPTS,
        first_delay_s: float = FIRST_DELAY_S,
    ) -> None:
        self._now = now
        self.attempts = attempts
        self.first_delay_s = first_delay_s
        self._lock = threading.Lock()
        # cluster id -> (failed attempts, the next attempt not before)
        self._failed: dict[str, tuple[int, datetime]] = {}

    def due(self, cluster_id: str) -> bool:
        """Whether the cluster's start may try now (False during its back-off)."""
        with self._lock:
            entry = self._failed.get(cluster_id)
        return entry is None or self._now() >= entry[1]

    def failed(self, cluster_id: str) -> int | None:
        """Count a failed attempt. Returns its number when another attempt follows
        (after the back-off), None when that was the last (the count is forgotten)."""
        with self._lock:
            count = self._failed.get(cluster_id, (0, self._now()))[0] + 1
            if count >= self.attempts:
                self._failed.pop(cluster_id, None)
                return None
            delay = timedelta(seconds=self.first_delay_s * 2 ** (count - 1))
            self._failed[cluster_id] = (count, self._now() + delay)
            return count

    def forget(self, cluster_id: str) -> None:
        """The start ended (running, error, or the cluster left ``starting``)."""
        with self._lock:
            self._failed.pop(cluster_id, None)
