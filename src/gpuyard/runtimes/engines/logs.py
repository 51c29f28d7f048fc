"""A container's timestamped output through the Docker Engine API (Docker or Podman).

``GET /containers/{name}/logs`` with ``timestamps=1``: every line starts with its RFC
3339 stamp. Podman 4.3 stamps to the second and takes ``since`` in whole seconds, so
reads ask from the second before and cut here (see core/log_lines.py for positions).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

import docker.errors

from gpuyard.core.log_lines import LogLine, extend_to_boundary, parse_timestamped
from gpuyard.runtimes.engines.engine import Engine

log = logging.getLogger(__name__)

_NS = 1_000_000_000


def _since_s(since_ns: int | None) -> int | None:
    """The engine's ``since`` (whole seconds, > 0) covering ``since_ns``, or None."""
    if since_ns is None or since_ns < _NS:
        return None
    return since_ns // _NS


def _decode(data: Any) -> str:
    return data.decode("utf-8", errors="replace") if isinstance(data, bytes) else str(data)


def _read(engine: Engine, name: str, tail: int | None, since_ns: int | None) -> list[LogLine]:
    kwargs: dict[str, Any] = {"tail": tail if tail is not None else "all"}
    since = _since_s(since_ns)
    if since is not None:
        kwargs["since"] = since
    with engine.errors(f"reading logs of container {name}"):
        try:
            data = engine.api.logs(name, stdout=True, stderr=True, timestamps=True, **kwargs)
        except docker.errors.NotFound:
            return []
    lines = parse_timestamped(_decode(data))
    if since_ns is not None:
        lines = [line for line in lines if line.ts_ns >= since_ns]
    return lines


def _read_head(engine: Engine, name: str, since_ns: int | None, head: int) -> list[LogLine]:
    """The first ``head`` lines stamped at or after ``since_ns``, read as a stream that
    is closed once they are in (a container's whole output may be far larger)."""
    kwargs: dict[str, Any] = {"tail": "all"}
    since = _since_s(since_ns)
    if since is not None:
        kwargs["since"] = since
    lines: list[LogLine] = []
    buffer = ""
    with engine.errors(f"reading logs of container {name}"):
        try:
            # follow=False said outright: the SDK follows any stream unless told not to.
            stream = engine.api.logs(
                name, stdout=True, stderr=True, timestamps=True, stream=True, follow=False, **kwargs
            )
        except docker.errors.NotFound:
            return []
        try:
            for chunk in stream:
                buffer += _decode(chunk)
                if "\n" not in buffer:
                    continue
                complete, _, buffer = buffer.rpartition("\n")
                lines += parse_timestamped(complete)
                if len(lines) >= head:
                    break
            else:
                lines += parse_timestamped(buffer)
        finally:
            stream.close()
    if since_ns is not None:
        lines = [line for line in lines if line.ts_ns >= since_ns]
    return lines[:head]


def read_lines(
    engine: Engine,
    name: str,
    *,
    tail: int | None,
    since_ns: int | None,
    head: int | None = None,
) -> list[LogLine]:
    """Container ``name``'s output as :meth:`Runtime.log_lines` defines it (a tail is
    widened to the start of its first timestamp with a second read from that second).
    Empty when the container does not exist; RuntimeFailure when the engine fails."""
    if head is not None:
        return _read_head(engine, name, since_ns, head) if head > 0 else []
    if tail is not None and tail <= 0:
        return []
    lines = _read(engine, name, tail, since_ns)
    if tail is None or len(lines) < tail or not lines:
        return lines
    return extend_to_boundary(lines, _read(engine, name, None, lines[0].ts_ns))


class EngineLogFollow:
    """``GET /containers/{name}/logs?follow=1&timestamps=1`` as lines (see
    :class:`gpuyard.runtimes.base.LogFollow`). The SDK lifts the socket's read timeout
    for streams, so a quiet container holds the connection open until :meth:`close`.
    """

    def __init__(self, engine: Engine, name: str, since_ns: int | None) -> None:
        self._engine = engine
        self._name = name
        self._since_ns = since_ns
        self._lock = threading.Lock()
        self._stream: Any = None
        self._closed = False

    def _open(self) -> Any:
        kwargs: dict[str, Any] = {"tail": "all"}
        since = _since_s(self._since_ns)
        if since is not None:
            kwargs["since"] = since
        with self._engine.errors(f"following logs of container {self._name}"):
            try:
                return self._engine.api.logs(
                    self._name,
                    stdout=True,
                    stderr=True,
                    timestamps=True,
                    stream=True,
                    follow=True,
                    **kwargs,
                )
            except docker.errors.NotFound:
                return None

    def __iter__(self) -> Iterator[LogLine]:
        stream = self._open()
        if stream is None:
            return
        with self._lock:
            if self._closed:
                stream.close()
                return
            self._stream = stream
        buffer = ""
        closed_by_caller = False
        try:
            for chunk in stream:
                buffer += _decode(chunk)
                if "\n" not in buffer:
                    continue
                complete, _, buffer = buffer.rpartition("\n")
                yield from parse_timestamped(complete)
        except Exception as e:  # a closed socket ends the stream, whatever it raises
            if not self._closed:
                log.debug("log stream of %s ended: %s", self._name, e)
        finally:
            closed_by_caller = self._closed
            self.close()
        if buffer and not closed_by_caller:
            # The container ended with a line that has no line break.
            yield from parse_timestamped(buffer)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            stream, self._stream = self._stream, None
        if stream is not None:
            try:
                stream.close()
            except Exception as e:  # closing twice or a dead socket is fine
                log.debug("closing the log stream of %s: %s", self._name, e)
