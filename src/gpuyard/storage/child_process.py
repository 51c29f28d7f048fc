"""Child processes run by the storage layer (restic): started so that they die with
the thread that started them, stopped cleanly or killed, and their pipes read or fed
so that they never block.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import json
import os
import signal
import subprocess
import threading
from collections import deque
from collections.abc import Callable, Iterable
from typing import IO, Any, Final

# How many of a child's last stderr lines a Drain keeps.
TAIL_LINES: Final = 20
# How long an interrupted child gets to clean up before it is killed.
INTERRUPT_GRACE_S: Final = 5.0
_PR_SET_PDEATHSIG: Final = 1


@functools.cache
def _prctl() -> Callable[..., int] | None:
    """libc's prctl, resolved in the parent (a child between fork and exec should not
    load libraries), or None where there is none."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fn: Callable[..., int] = libc.prctl
    except (OSError, AttributeError):
        return None
    return fn


def die_with_parent(signum: int = signal.SIGKILL) -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child get ``signum`` (SIGKILL unless told: a
    child that must clean up first gets SIGTERM) when the thread that forked it ends
    (the process dying included); None where prctl is missing."""
    prctl = _prctl()
    if prctl is None:
        return None
    parent = os.getpid()

    def preexec() -> None:
        # Runs in the child between fork and exec: no allocation-heavy work, no raising.
        # The signal follows the thread that forked, so the caller keeps its thread
        # alive for the child's whole life (every caller here waits for its child).
        with contextlib.suppress(Exception):
            prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0)
            if os.getppid() != parent:  # the parent died before prctl took effect
                os.kill(os.getpid(), signum)

    return preexec


def kill(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the child (if it still runs) and reap it."""
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    proc.wait()


def interrupt(proc: subprocess.Popen[bytes]) -> None:
    """Stop a child that should clean up (restic removes its lock on SIGINT only, not
    on SIGTERM): SIGINT, then SIGKILL if it lingers past INTERRUPT_GRACE_S."""
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGINT)
    try:
        proc.wait(INTERRUPT_GRACE_S)
    except subprocess.TimeoutExpired:
        kill(proc)


class Drain(threading.Thread):
    """Reads a pipe to its end so the child never blocks on it, keeping the last lines
    and (optionally) the last JSON object whose ``message_type`` is ``want``."""

    def __init__(self, pipe: IO[bytes], want: str | None = None) -> None:
        super().__init__(name="child-pipe", daemon=True)
        self._pipe = pipe
        self._want = f'"message_type":"{want}"'.encode() if want else None
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        self.found: dict[str, Any] | None = None
        self.start()

    def run(self) -> None:
        with contextlib.suppress(OSError, ValueError), self._pipe:
            for line in self._pipe:
                if self._want is not None:
                    # Status lines come at 60 a second: parse only the one wanted.
                    if self._want in line:
                        with contextlib.suppress(ValueError):
                            found = json.loads(line)
                            if isinstance(found, dict):
                                self.found = found
                    continue
                self.tail.append(line.decode("utf-8", "replace").rstrip())

    def text(self) -> str:
        self.join()
        return "\n".join(self.tail)


def write_all(stdin: IO[bytes], chunks: Iterable[bytes | bytearray | memoryview]) -> None:
    """Feed ``chunks`` to the child and close its stdin (the EOF that ends the stream).
    Stops early, silently, when restic has exited: its status tells why. Only a
    failed write means that: a BrokenPipeError from the source propagates (ending the
    stream cleanly then would commit it truncated)."""
    for chunk in chunks:
        try:
            stdin.write(chunk)
        except BrokenPipeError:
            break
    # Flushing into a pipe restic closed fails the same way, and means the same.
    with contextlib.suppress(BrokenPipeError):
        stdin.close()
