"""How use cases hand work to the background without importing it.

A use case records its intent in the store, commits, and then rings:

- ``ctx.wake()``: the reconciler looks again now instead of at its next interval. The
  reconciler's lanes wait on the context's :class:`WorkSignal`
  (reconciler/wiring.py ``lanes_for``), so every reconciler built on a context hears
  its use cases.
- ``ctx.training_wake(cluster_id)``: the training operator runs the cluster's recorded
  operation; ``ctx.training_edge(cluster_id)``: it re-syncs the cluster's host rules
  (SSH port, reserved IPs). The server answers both :class:`Doorbell` s with its
  operator when it builds one (api/app.py ``build_server``).

With nothing answering (a test of one use case, a server without training) a ring
does nothing: the intent is in the store, and the next scan picks it up. That is also
why a ring never raises into the use case that rang.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


class WorkSignal:
    """ "Look again": set by :meth:`wake`, consumed by one :meth:`wait`. Lag is measured
    from the first wake since the waiter last looked."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._woken_at: float | None = None

    def wake(self) -> None:
        if self._woken_at is None:
            self._woken_at = time.monotonic()
        self._event.set()

    def wait(self, timeout_s: float) -> float | None:
        """Sleep until woken or ``timeout_s`` passed; when the first wake came (monotonic
        time; None: not woken)."""
        self._event.wait(timeout_s)
        self._event.clear()
        woken_at, self._woken_at = self._woken_at, None
        return woken_at


class Doorbell(Generic[T]):
    """A call with one answerer, named where it is rung. :meth:`answer` sets who
    answers (the newest answerer replaces the one before: a restarted operator takes
    over); ringing with no answerer does nothing."""

    def __init__(self) -> None:
        self._answer: Callable[[T], None] | None = None

    def answer(self, handler: Callable[[T], None]) -> None:
        self._answer = handler

    def __call__(self, value: T) -> None:
        handler = self._answer
        if handler is None:
            return
        try:
            handler(value)
        except Exception:
            # The use case has committed; the background's scan picks the work up.
            log.exception("ringing for %r failed; the next scan picks it up", value)
