"""When clusters' next restart attempts are due: the driver says so when it counts a
failure, the loop dispatches each attempt once it is due and sleeps no longer."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import datetime


class RestartSchedule:
    """Cluster id -> when its next restart attempt is due. ``wake`` is called when one
    is added (the loop then recomputes its sleep)."""

    def __init__(self, now: Callable[[], datetime], wake: Callable[[], None]) -> None:
        self._now = now
        self._wake = wake
        self._lock = threading.Lock()
        self._due: dict[str, datetime] = {}

    def due_at(self, cluster_id: str, at: datetime) -> None:
        """The driver's ``on_restart_due``."""
        with self._lock:
            self._due[cluster_id] = at
        self._wake()

    def take_due(self) -> list[str]:
        """The clusters whose attempt is due now, forgotten here."""
        now = self._now()
        with self._lock:
            due = [cid for cid, at in self._due.items() if at <= now]
            for cid in due:
                del self._due[cid]
        return due

    def seconds_until_next(self) -> float | None:
        """Seconds until the first attempt is due (None: none is)."""
        with self._lock:
            if not self._due:
                return None
            first = min(self._due.values())
        return max(0.0, (first - self._now()).total_seconds())
