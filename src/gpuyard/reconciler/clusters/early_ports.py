"""The host's taken ports, asked as a start begins (reconciler/clusters/driver.py).

A start whose ports are all gpuyard's choice asks the host which ports of the range
something holds while its container is created (driver ``_create``). The asking is
an engine listing and a command on the host; made at the create, the listing runs
in the same engine at the same moment as the start's own volume and container
requests, and slows them. Asked when the start begins, it runs beside the start's
reads of the store and its spec instead, and is mostly done by the create.

The answer is a snapshot either way (runtimes/hosts/ports.py); one taken long before
the create (a volume moved or a snapshot restored in between) is not used: the
create asks again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Final

from gpuyard.core.side_by_side import SideBySide

HostPort = tuple[int, str]

# How old an answer the create still takes (from the ask's start to the create).
FRESH_S: Final = 1.0


class EarlyPortsAsk:
    """``ask()`` started now on its own thread. :meth:`take` hands the running ask to
    the one create that uses it, while fresh; :meth:`settle` waits for it to end."""

    def __init__(
        self,
        ask: Callable[[], frozenset[HostPort]],
        *,
        clock: Callable[[], float] = time.monotonic,
        fresh_s: float = FRESH_S,
    ) -> None:
        self._clock = clock
        self._until = clock() + fresh_s
        self._lock = threading.Lock()
        self._taken = False
        self._ask = SideBySide(ask, name="host-ports")

    def take(self) -> SideBySide[frozenset[HostPort]] | None:
        """The ask, the first time and while fresh; None after (ask again then)."""
        with self._lock:
            if self._taken or self._clock() >= self._until:
                return None
            self._taken = True
            return self._ask

    def settle(self) -> None:
        """Wait for the ask to end, whatever it ends with."""
        self._ask.settle()
