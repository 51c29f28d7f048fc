"""Where serverless workers' containers are told to reach the server."""

from __future__ import annotations

import pytest

from gpuyard.services.serverless.callback import (
    callback_base_url,
    needs_worker_listener,
    worker_port,
)
from gpuyard.settings import Settings

H = "host.containers.internal"


@pytest.mark.parametrize(
    ("kw", "url", "listener"),
    [
        ({"host": "127.0.0.1", "port": 8000}, f"http://{H}:8001", True),
        ({"host": "localhost", "port": 8000}, f"http://{H}:8001", True),
        (
            {"host": "127.0.0.1", "port": 8000, "serverless_worker_port": 9999},
            f"http://{H}:9999",
            True,
        ),
        ({"host": "0.0.0.0", "port": 8080}, f"http://{H}:8080", False),
        (
            {"host": "0.0.0.0", "port": 8080, "public_address": "203.0.113.7"},
            "http://203.0.113.7:8080",
            False,
        ),
        ({"host": "192.0.2.5", "port": 9000}, "http://192.0.2.5:9000", False),
        ({"host": "fd00::5", "port": 9000}, "http://[fd00::5]:9000", False),
        (
            {"host": "127.0.0.1", "serverless_callback_url": "https://cp.example/"},
            "https://cp.example",
            False,
        ),
    ],
)
def test_callback_url(kw: dict[str, object], url: str, listener: bool) -> None:
    s = Settings(**kw)  # type: ignore[arg-type]
    assert callback_base_url(s) == url
    assert needs_worker_listener(s) is listener


def test_worker_port_defaults_to_the_next_port() -> None:
    assert worker_port(Settings(port=8000)) == 8001  # type: ignore[call-arg]
