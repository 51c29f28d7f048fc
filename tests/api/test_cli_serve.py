"""``gpuyard serve`` as a real process: first-start key, credentials, key redaction in
the access log, clean exit on SIGTERM and SIGINT. No engine is needed (a missing one is
named in GPUYARD_ENGINE_URL so no Podman service is started)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpuyard.core.tls_trust import trusted_tls
from tests.helpers import free_port


def start_serve(home: Path, port: int) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "GPUYARD_HOME": str(home),
        # The HTTP proxy and SSH gateway listen on fixed ports: not needed here.
        "GPUYARD_PROXY_ENABLED": "false",
        "GPUYARD_SSH_PORT": "0",
        "GPUYARD_ENGINE_URL": "unix:///nonexistent/engine.sock",
        "GPUYARD_LOCAL_GPUS": "NVIDIA RTX A6000:2",
        "GPUYARD_LOCAL_VCPUS": "8",
        "GPUYARD_LOCAL_MEMORY_GB": "32",
        "GPUYARD_LOCAL_DISK_GB": "100",
    }
    return subprocess.Popen(
        [sys.executable, "-m", "gpuyard", "serve", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_up(url: str, proc: subprocess.Popen[Any]) -> None:
    """Until the server at ``url`` answers /healthz; fails if ``proc`` exits first."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        try:
            httpx.get(f"{url}/healthz", timeout=1, verify=trusted_tls())
            return
        except httpx.TransportError:
            time.sleep(0.1)
    raise AssertionError("server did not start")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_serve_prints_key_once_redacts_logs_and_exits_cleanly(
    tmp_path: Path, sig: signal.Signals
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_serve(tmp_path, port)
    try:
        wait_up(url, proc)
        creds = json.loads((tmp_path / "credentials").read_text())
        key = creds["api_key"]
        assert creds["url"] == url
        assert (tmp_path / "credentials").stat().st_mode & 0o777 == 0o600
        assert (
            httpx.get(f"{url}/v1/gpu-types?api_key={key}", verify=trusted_tls()).status_code == 200
        )
        assert httpx.get(f"{url}/v1/clusters?apikey={key}", verify=trusted_tls()).status_code == 200
        time.sleep(0.2)  # let the access log lines out
    finally:
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    # stdout is a pipe, not a terminal: the key stays in the credentials file only.
    assert key not in out and f"key saved to {tmp_path / 'credentials'}" in out
    assert key not in err
    assert "api_key=***" in err and "apikey=***" in err
    assert "Traceback" not in err


def test_serve_second_start_prints_no_key(tmp_path: Path) -> None:
    for expected in (True, False):
        port = free_port()
        proc = start_serve(tmp_path, port)
        try:
            wait_up(f"http://127.0.0.1:{port}", proc)
        finally:
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=20)
        assert ("key saved to" in out) is expected
