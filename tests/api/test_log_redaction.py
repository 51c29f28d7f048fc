"""No API key reaches the server log in any spelling the server accepts (or one that
looks like it): percent-encoded names (``api%5Fkey``, double-encoded), other cases,
``apikey``, repeated parameters, percent-encoded values, the Authorization header.

Against ``gpuyard serve`` as a real process (its own logging setup and uvicorn's access
log), and against the filter with records shaped as uvicorn's access log makes them."""

from __future__ import annotations

import io
import json
import logging
import signal
from pathlib import Path

import httpx
import pytest

from gpuyard.cli.serve import RedactKeysFilter, configure_logging, redact
from gpuyard.core.tls_trust import trusted_tls
from tests.api.test_cli_serve import start_serve, wait_up
from tests.helpers import free_port

# Each probe carries its own secret, so a leak names the spelling that leaked.
PROBES = {
    "/v1/gpu-types?api%5Fkey=SECRETA1": "SECRETA1",
    "/v1/gpu-types?api%5fkey=SECRETA2&x=1": "SECRETA2",
    "/v1/gpu-types?%61pi_key=SECRETA3": "SECRETA3",
    "/v1/gpu-types?api%255Fkey=SECRETA4": "SECRETA4",
    "/v1/gpu-types?API_KEY=SECRETA5": "SECRETA5",
    "/v1/gpu-types?ApiKey=SECRETA6": "SECRETA6",
    "/v1/gpu-types?apikey=SECRETA7": "SECRETA7",
    "/v1/gpu-types?api_key=SECRETA8&api_key=SECRETA9": "SECRETA8",
    "/v1/gpu-types?a=1&api-key=SECRETB1": "SECRETB1",
    "/v1/gpu-types?api_key=SECRET%42%32": "SECRET%42%32",
    "/v1/gpu-types?api+key=SECRETB3": "SECRETB3",
    "/v1/gpu-types?api_key[]=SECRETB4": "SECRETB4",
    '/v1/gpu-types?q="x;y"&api_key=SECRETB5;z': "SECRETB5",
}


def access_line(path_with_query: str) -> logging.LogRecord:
    """A record as uvicorn's access logger makes it (httptools and h11 alike)."""
    return logging.LogRecord(
        "uvicorn.access",
        logging.INFO,
        __file__,
        1,
        '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:5555", "GET", path_with_query, "1.1", 401),
        None,
    )


def test_filter_redacts_every_spelling_in_access_records() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RedactKeysFilter())
    for path, secret in PROBES.items():
        record = access_line(path)
        handler.handle(record)
        assert secret not in stream.getvalue(), path
    assert "SECRETA9" not in stream.getvalue()
    # What is not a key stays readable.
    assert "x=1" in stream.getvalue() and "a=1" in stream.getvalue()


@pytest.mark.parametrize(
    "text",
    [
        "authorization: Bearer SECRETC1",
        "Authorization: SECRETC1",
        "{'authorization': 'Bearer SECRETC1'}",
        "[(b'authorization', b'Bearer SECRETC1')]",
        '{"api_key": "SECRETC1"}',
        "apikey: SECRETC1",
        "key gy_SECRETC1abcdef",
    ],
)
def test_headers_and_fields_are_redacted(text: str) -> None:
    assert "SECRETC1" not in redact(text)


def test_serve_logs_no_key_in_any_spelling(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_serve(tmp_path, port)
    try:
        wait_up(url, proc)
        key = json.loads((tmp_path / "credentials").read_text())["api_key"]
        # The percent-encoded name is accepted: it is the same parameter.
        with httpx.Client(base_url=url, verify=trusted_tls()) as c:
            assert c.get(f"/v1/gpu-types?api%5Fkey={key}").status_code == 200
            assert c.get(f"/v1/clusters?apikey={key}&apikey={key}").status_code == 200
            for path in PROBES:
                assert c.get(path).status_code == 401, path
            assert c.get("/v1/gpu-types", headers={"Authorization": "SECRETC9"}).status_code == 401
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    assert "GET /v1/gpu-types?api%5Fkey=*** HTTP/1.1" in err  # the access log is on
    assert key not in err
    leaks = [s for s in [*PROBES.values(), "SECRETA9", "SECRETC9"] if s in err]
    assert not leaks, err


def test_configure_logging_writes_redacted_lines_to_the_given_stream() -> None:
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    stream = io.StringIO()
    try:
        configure_logging(stream=stream)
        # Straight to the root's handlers: an in-process uvicorn of another test may have
        # stopped "uvicorn.access" from propagating (``gpuyard serve`` never does).
        root.handle(access_line("/x?api%5Fkey=SECRETD1"))
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
    assert "api%5Fkey=***" in stream.getvalue() and "SECRETD1" not in stream.getvalue()
