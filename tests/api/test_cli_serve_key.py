"""``gpuyard serve``'s first-start admin key reaches the terminal only: with stdout a
pipe (a journal, a CI log) it prints where the key was saved and never the key; with
stdout a terminal it shows the key once. Real processes, no engine needed."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.api.test_cli_serve import wait_up
from tests.helpers import free_port


def serve(home: Path, port: int, stdout: int) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "GPUYARD_HOME": str(home),
        # The HTTP proxy and SSH gateway listen on fixed ports: not needed here.
        "GPUYARD_PROXY_ENABLED": "false",
        "GPUYARD_SSH_PORT": "0",
        "GPUYARD_ENGINE_URL": "unix:///nonexistent/engine.sock",
        "GPUYARD_LOCAL_GPUS": "NVIDIA RTX A6000:1",
        "GPUYARD_LOCAL_VCPUS": "8",
        "GPUYARD_LOCAL_MEMORY_GB": "32",
        "GPUYARD_LOCAL_DISK_GB": "100",
        "GPUYARD_TRAINING_ENABLED": "false",
    }
    return subprocess.Popen(
        [sys.executable, "-m", "gpuyard", "serve", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=stdout,
        stderr=subprocess.PIPE,
    )


def saved_key(home: Path) -> str:
    key: str = json.loads((home / "credentials").read_text())["api_key"]
    return key


def test_piped_stdout_gets_the_path_not_the_key(tmp_path: Path) -> None:
    port = free_port()
    proc = serve(tmp_path, port, subprocess.PIPE)
    try:
        wait_up(f"http://127.0.0.1:{port}", proc)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
    key = saved_key(tmp_path)
    assert proc.returncode == 0, err
    assert key.encode() not in out and key.encode() not in err
    assert f"key saved to {tmp_path / 'credentials'}".encode() in out


def test_a_terminal_is_shown_the_key(tmp_path: Path) -> None:
    port = free_port()
    leader, follower = pty.openpty()
    proc = serve(tmp_path, port, follower)
    os.close(follower)
    out = b""
    try:
        wait_up(f"http://127.0.0.1:{port}", proc)
        key = saved_key(tmp_path).encode()
        deadline = time.monotonic() + 10
        while key not in out and time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 0.2)
            if ready:
                out += os.read(leader, 65536)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=20)
        os.close(leader)
    assert b"API key:" in out and key in out
