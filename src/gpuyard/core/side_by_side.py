"""One call run on a thread of its own while the caller does something else.

The start path has steps that wait on different things (a command on the engine's
host, the engine's API, the store) and need not wait on each other; this runs one of
them beside the rest. No pool: a start makes at most a couple of these, and a thread
that is not asked for its answer ends with its call (it is a daemon thread, so it
never holds up the process's exit).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class SideBySide(Generic[T]):
    """``call()`` started now on its own thread; :meth:`result` waits for it and returns
    its value or raises what it raised (any exception, in the caller's thread)."""

    def __init__(self, call: Callable[[], T], name: str = "side-by-side") -> None:
        self._call = call
        self._value: T | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._value = self._call()
        except BaseException as exc:  # handed to the caller by result()
            self._error = exc

    def result(self) -> T:
        """The call's value, once it has returned; raises what it raised. May be
        asked more than once (the same answer each time)."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]

    def settle(self) -> None:
        """Wait for the call to end, whatever it ends with (the caller is already
        failing for its own reason and only must not leave the call running)."""
        self._thread.join()
