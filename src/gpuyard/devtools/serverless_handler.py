"""The serverless test image's worker: ``python -u handler.py`` in the image (copied there
as ``/app/handler.py``), a plain RunPod worker over the unmodified runpod-python SDK.

The handler is chosen by the environment variable ``HANDLER`` (default ``echo``):

- ``echo``: returns the job's input unchanged.
- ``stream``: a generator yielding ``input["chunks"]`` chunks (default 3), one every
  ``input["interval_s"]`` seconds (default 0), each ``{"index": i, "of": n}``; started with
  ``return_aggregate_stream``, so the job's output is the list of chunks.
- ``slow``: sleeps ``input["seconds"]`` (or the input itself when it is a number) and
  returns ``{"slept": seconds, "worker": RUNPOD_POD_ID}``. Async, so a stop asked by the
  server (cancel, execution timeout) ends the sleep at once.
- ``async``: an ``async def`` handler returning ``{"async": true, "input": input}``.
- ``concurrent``: an async handler sleeping ``input["seconds"]`` (default 0.5) with a
  ``concurrency_modifier`` of ``CONCURRENCY`` (default 4) jobs at once per worker; it
  returns ``{"worker": ..., "in_flight_max": n}``, the most jobs this process ran at once.

With ``DIRECT_HTTP_PORT`` set, the same handler is also served over plain HTTP on that
port (all addresses): ``POST /`` with ``{"input": ...}`` answers the handler's output as
JSON (a generator's chunks as a list), ``GET /health`` answers ``{"status": "ok"}``. When
no RunPod worker environment is set (``RUNPOD_WEBHOOK_GET_JOB``) and no runpod argument
is given, the process only serves HTTP (the baseline a benchmark compares against);
otherwise it also runs ``runpod.serverless.start`` as any RunPod image does, so
``--test_input '{"input": ...}'`` runs one job locally and prints its result.

This module runs inside the image, never inside gpuyard: it imports only the standard
library and runpod.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import signal
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import runpod

HANDLERS = ("echo", "stream", "slow", "async", "concurrent")
DEFAULT_CONCURRENCY = 4

Job = dict[str, Any]


def _input(job: Job) -> Any:
    return job.get("input")


def _param(job: Job, key: str, default: float) -> float:
    value = _input(job)
    if isinstance(value, dict) and isinstance(value.get(key), int | float):
        return float(value[key])
    return default


def echo(job: Job) -> Any:
    """The job's input, unchanged."""
    return _input(job)


def stream(job: Job) -> Iterator[dict[str, int]]:
    """``chunks`` chunks in order, ``interval_s`` apart."""
    n = int(_param(job, "chunks", 3))
    interval = _param(job, "interval_s", 0.0)
    for i in range(n):
        if i and interval > 0:
            time.sleep(interval)
        yield {"index": i, "of": n}


async def slow(job: Job) -> dict[str, Any]:
    """Sleep the input's seconds (cancellable: it awaits)."""
    value = _input(job)
    seconds = float(value) if isinstance(value, int | float) else _param(job, "seconds", 1.0)
    await asyncio.sleep(max(0.0, seconds))
    return {"slept": seconds, "worker": os.environ.get("RUNPOD_POD_ID", "local")}


async def async_handler(job: Job) -> dict[str, Any]:
    """An ``async def`` handler: the input back, marked."""
    await asyncio.sleep(_param(job, "sleep_s", 0.0))
    return {"async": True, "input": _input(job)}


class _InFlight:
    """How many jobs run at once in this process, and the most seen."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.now = 0
        self.most = 0

    def enter(self) -> None:
        with self._lock:
            self.now += 1
            self.most = max(self.most, self.now)

    def leave(self) -> None:
        with self._lock:
            self.now -= 1


IN_FLIGHT = _InFlight()


async def concurrent(job: Job) -> dict[str, Any]:
    """Sleep ``seconds`` (default 0.5) beside the other jobs this worker runs."""
    IN_FLIGHT.enter()
    try:
        await asyncio.sleep(_param(job, "seconds", 0.5))
        return {"worker": os.environ.get("RUNPOD_POD_ID", "local"), "in_flight_max": IN_FLIGHT.most}
    finally:
        IN_FLIGHT.leave()


def concurrency(_current: int) -> int:
    """runpod's ``concurrency_modifier``: ``CONCURRENCY`` jobs at once (default 4)."""
    try:
        return max(1, int(os.environ.get("CONCURRENCY", DEFAULT_CONCURRENCY)))
    except ValueError:
        return DEFAULT_CONCURRENCY


def worker_config(name: str) -> dict[str, Any]:
    """The config ``runpod.serverless.start`` gets for the handler ``name``. Raises
    ValueError for a name not in :data:`HANDLERS`."""
    if name == "echo":
        return {"handler": echo}
    if name == "stream":
        return {"handler": stream, "return_aggregate_stream": True}
    if name == "slow":
        return {"handler": slow}
    if name == "async":
        return {"handler": async_handler}
    if name == "concurrent":
        return {"handler": concurrent, "concurrency_modifier": concurrency}
    raise ValueError(f"HANDLER={name!r}: choose one of {', '.join(HANDLERS)}")


def call_handler(handler: Callable[[Job], Any], job: Job) -> Any:
    """Run ``handler`` on ``job`` outside runpod: awaits a coroutine, collects a
    generator's (or async generator's) chunks into a list."""
    if inspect.isasyncgenfunction(handler):

        async def collect() -> list[Any]:
            agen: AsyncIterator[Any] = handler(job)
            return [chunk async for chunk in agen]

        return asyncio.run(collect())
    result = handler(job)
    if inspect.isawaitable(result):

        async def wait() -> Any:
            return await result

        return asyncio.run(wait())
    if inspect.isgenerator(result):
        return list(result)
    return result


def make_http_server(
    handler: Callable[[Job], Any], port: int, host: str = "0.0.0.0"
) -> ThreadingHTTPServer:
    """An HTTP/1.1 server (keep-alive, a thread per connection) answering ``POST /`` with
    the handler's output for ``{"input": ...}`` and ``GET /health``; not yet serving."""

    class Direct(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # Headers and body are two writes: with Nagle's algorithm the body would wait
        # for the client's delayed ACK (40 ms a request on Linux).
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: Any) -> None:  # quiet: benchmarks
            return

        def _answer(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True  # the client left; nothing to answer

        def do_GET(self) -> None:
            if self.path in ("/health", "/"):
                self._answer(200, {"status": "ok", "handler": os.environ.get("HANDLER", "echo")})
            else:
                self._answer(404, {"error": "not found"})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            if self.path != "/":
                self._answer(404, {"error": "not found"})
                return
            try:
                body = json.loads(raw or b"null")
            except ValueError:
                self._answer(400, {"error": "the body is not JSON"})
                return
            if not isinstance(body, dict) or "input" not in body:
                self._answer(400, {"error": 'the body must be {"input": ...}'})
                return
            try:
                output = call_handler(handler, {"id": "direct", "input": body["input"]})
            except Exception as e:  # the handler's failure, reported like runpod does
                self._answer(500, {"error": f"{type(e).__name__}: {e}"})
                return
            self._answer(200, output)

    server = ThreadingHTTPServer((host, port), Direct)
    server.daemon_threads = True
    return server


def _runpod_asked(argv: list[str]) -> bool:
    """True when runpod's worker should run: under a RunPod worker environment, or with
    a runpod argument (``--test_input``, ``--rp_serve_api``, ...)."""
    if os.environ.get("RUNPOD_WEBHOOK_GET_JOB"):
        return True
    return any(arg.startswith(("--test_input", "--rp_")) for arg in argv[1:])


def main(argv: list[str]) -> None:
    config = worker_config(os.environ.get("HANDLER", "echo"))
    port = os.environ.get("DIRECT_HTTP_PORT")
    server = make_http_server(config["handler"], int(port)) if port else None
    if server is not None and not _runpod_asked(argv):
        # Only the direct server: as PID 1 a signal without a handler is ignored.
        signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
        print(f"serving HANDLER={os.environ.get('HANDLER', 'echo')} on :{port}", flush=True)
        server.serve_forever()
        return
    if server is not None:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    runpod.serverless.start(config)


if __name__ == "__main__":
    main(sys.argv)
