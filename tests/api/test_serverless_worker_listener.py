"""``gpuyard serve`` on loopback with a serverless worker port: the second listener
(every address) lets only requests with a worker's key under /runpod/v2/ reach the app;
the main listener is as before. A real process, no engine."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from gpuyard.core.ids import new_worker_key
from gpuyard.core.tls_trust import trusted_tls
from tests.helpers import free_port

GATE = "only serverless workers are served here"


def test_the_worker_listener_serves_workers_only(tmp_path: Path) -> None:
    port, worker_port = free_port(), free_port()
    env = {
        **os.environ,
        "GPUYARD_HOME": str(tmp_path / "home"),
        "GPUYARD_PROXY_ENABLED": "false",
        "GPUYARD_SSH_PORT": "0",
        "GPUYARD_ENGINE_URL": "unix:///nonexistent/engine.sock",
        "GPUYARD_LOCAL_GPUS": "NVIDIA RTX A6000:2",
        "GPUYARD_LOCAL_VCPUS": "8",
        "GPUYARD_LOCAL_MEMORY_GB": "32",
        "GPUYARD_LOCAL_DISK_GB": "100",
        "GPUYARD_SERVERLESS_WORKER_PORT": str(worker_port),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuyard", "serve", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        main, workers = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{worker_port}"
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, proc.communicate()
            try:
                if httpx.get(f"{main}/healthz", timeout=1, verify=trusted_tls()).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.1)
        key = new_worker_key()
        path = "/runpod/v2/abcdefghijklm1/health"
        refused = httpx.get(f"{workers}/healthz", timeout=5, verify=trusted_tls())
        assert refused.status_code == 404 and refused.json()["detail"] == GATE
        assert (
            httpx.get(
                f"{workers}/v1/clusters", headers={"Authorization": key}, verify=trusted_tls()
            ).json()["detail"]
            == GATE
        )
        # A worker's key reaches the app (whose answer this is, not the gate's).
        through = httpx.get(
            f"{workers}{path}", headers={"Authorization": key}, timeout=5, verify=trusted_tls()
        )
        assert through.json().get("detail") != GATE
        assert httpx.get(f"{main}/healthz", timeout=5, verify=trusted_tls()).status_code == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
