"""``gpuyard serve`` names a request's source by its peer address: X-Forwarded-For is
believed only from the proxies GPUYARD_TRUSTED_PROXIES lists, so a client cannot step
around the per-source limit by making up a new address for each request."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from gpuyard.core.tls_trust import trusted_tls
from tests.api.test_cli_serve import wait_up
from tests.helpers import free_port


@pytest.mark.parametrize(
    ("trusted", "expected"), [("", [200, 200, 429, 429]), ("127.0.0.1", [200] * 4)]
)
def test_x_forwarded_for_names_the_source_only_behind_a_listed_proxy(
    tmp_path: Path, trusted: str, expected: list[int]
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "GPUYARD_HOME": str(tmp_path),
        # The HTTP proxy and SSH gateway listen on fixed ports: not needed here.
        "GPUYARD_PROXY_ENABLED": "false",
        "GPUYARD_SSH_PORT": "0",
        "GPUYARD_ENGINE_URL": "unix:///nonexistent/engine.sock",
        "GPUYARD_LOCAL_GPUS": "NVIDIA RTX A6000:2",
        "GPUYARD_RATE_LIMIT_PER_KEY": "0",
        "GPUYARD_RATE_LIMIT_PER_SOURCE": "0.001",
        "GPUYARD_RATE_LIMIT_SOURCE_BURST": "2",
        "GPUYARD_TRUSTED_PROXIES": trusted,
    }
    command = [sys.executable, "-m", "gpuyard", "serve", "--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        wait_up(url, proc)
        key = json.loads((tmp_path / "credentials").read_text())["api_key"]
        codes = [
            httpx.get(
                f"{url}/v1/gpu-types",
                headers={"Authorization": f"Bearer {key}", "X-Forwarded-For": f"203.0.113.{i}"},
                verify=trusted_tls(),
            ).status_code
            for i in range(4)
        ]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=20)
    assert codes == expected
