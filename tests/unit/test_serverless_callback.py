"""Where serverless workers' containers are told to reach the server."""

from __future__ import annotations

import pytest

from gpuyard.services.serverless.callback import (
    callback_base_url,
    unreachable_warning,
    worker_port,
)
from gpuyard.settings import Settings

H = "host.containers.internal"


@pytest.mark.parametrize(
    ("kw", "url", "listener", "warned"),
    [
        ({"host": "127.0.0.1", "port": 8000}, f"http://{H}:8000", None, True),
        (
            {"host": "127.0.0.1", "port": 8000, "serverless_worker_port": 8001},
            f"http://{H}:8001",
            8001,
            False,
        ),
        (
            {"host": "localhost", "port": 8000, "serverless_worker_port": 9999},
            f"http://{H}:9999",
            9999,
            False,
        ),
        ({"host": "0.0.0.0", "port": 8080}, f"http://{H}:8080", None, False),
        (
            {"host": "0.0.0.0", "port": 8080, "serverless_worker_port": 8081},
            f"http://{H}:8080",
            None,
            False,
        ),
        (
            {"host": "0.0.0.0", "port": 8080, "public_address": "203.0.113.7"},
            "http://203.0.113.7:8080",
            None,
            False,
        ),
        ({"host": "192.0.2.5", "port": 9000}, "http://192.0.2.5:9000", None, False),
        ({"host": "fd00::5", "port": 9000}, "http://[fd00::5]:9000", None, False),
        (
            {"host": "127.0.0.1", "serverless_callback_url": "https://cp.example/"},
            "https://cp.example",
            None,
            False,
        ),
    ],
)
def test_callback_url(kw: dict[str, object], url: str, listener: int | None, warned: bool) -> None:
    s = Settings(**kw)  # type: ignore[arg-type]
    assert callback_base_url(s) == url
    assert worker_port(s) == listener
    assert (unreachable_warning(s) is not None) is warned
