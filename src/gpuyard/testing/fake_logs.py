"""Timestamped output for the fake runtime (testing/fake_runtime.py).

A fake container's output is a list of strings tests append to; each line is stamped
the first time anyone reads it, with the wall clock cut to ``resolution_ns`` (one
second by default, as Podman's Docker API stamps, so many lines share a stamp) and
never earlier than a line stamped before it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

from gpuyard.core.log_lines import LogLine

# A fake follow looks for new lines this often (tests append to lists, unannounced).
POLL_S = 0.02

# (lines from this index on, whether more may come)
Reader = Callable[[int], tuple[list[LogLine], bool]]


class LogStamps:
    """Stamps for the lines of every container of one fake engine."""

    def __init__(self, resolution_ns: int = 1_000_000_000) -> None:
        self.resolution_ns = resolution_ns
        self._last = 0

    def stamp(self, texts: list[str], stamps: list[int]) -> list[LogLine]:
        """Stamp the lines of ``texts`` that have none yet (appending to ``stamps``);
        every line with its stamp. Caller holds the engine's lock."""
        now = time.time_ns()
        now -= now % max(self.resolution_ns, 1)
        while len(stamps) < len(texts):
            self._last = max(self._last, now)
            stamps.append(self._last)
        return [LogLine(ts, text) for ts, text in zip(stamps, texts, strict=False)]


def select(lines: list[LogLine], tail: int | None, since_ns: int | None) -> list[LogLine]:
    """``lines`` as Runtime.log_lines answers them: stamped at or after ``since_ns``,
    the last ``tail`` widened to the start of their first stamp."""
    if since_ns is not None:
        lines = [line for line in lines if line.ts_ns >= since_ns]
    if tail is None:
        return lines
    if tail <= 0:
        return []
    start = max(len(lines) - tail, 0)
    while 0 < start < len(lines) and lines[start - 1].ts_ns == lines[start].ts_ns:
        start -= 1
    return lines[start:]


class FakeLogFollow:
    """Runtime.follow_log of the fake: what ``read`` answers from the second of
    ``since_ns`` on, then new lines as tests append them, until the container stops
    (``read`` says no more may come) or :meth:`close`."""

    def __init__(self, read: Reader | None, since_ns: int | None) -> None:
        self._read = read
        self._from = 0 if since_ns is None else since_ns - since_ns % 1_000_000_000
        self._closed = threading.Event()

    def __iter__(self) -> Iterator[LogLine]:
        if self._read is None:
            return
        index = 0
        while not self._closed.is_set():
            lines, more = self._read(index)
            index += len(lines)
            for line in lines:
                if line.ts_ns >= self._from:
                    yield line
            if not more:
                return
            self._closed.wait(POLL_S)

    def close(self) -> None:
        self._closed.set()
