"""A local S3-compatible server for tests: moto's server mode on a free loopback port,
always terminated."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from gpuyard.core.tls_trust import trusted_tls
from tests.helpers import free_port

# What restic (and any S3 client) needs to talk to it.
S3_ENV = {
    "AWS_ACCESS_KEY_ID": "test",
    "AWS_SECRET_ACCESS_KEY": "test",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def moto_server_path() -> Path | None:
    server = Path(sys.executable).parent / "moto_server"
    return server if server.exists() else None


@contextmanager
def moto_s3(log_dir: Path) -> Iterator[str]:
    """Run moto's S3 server; yields its endpoint (``http://127.0.0.1:PORT``). The caller
    checks :func:`moto_server_path` first (``need``, tests/required_parts.py)."""
    server = moto_server_path()
    assert server is not None, "moto_server is not installed (pip install 'moto[server]')"
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    log = log_dir / "moto.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(server), "-H", "127.0.0.1", "-p", str(port)], stdout=out, stderr=out
        )
    try:
        deadline = time.monotonic() + 20
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                httpx.get(endpoint, timeout=1, verify=trusted_tls())
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "moto_server did not start"
                time.sleep(0.1)
        yield endpoint
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def make_bucket(endpoint: str, bucket: str) -> None:
    assert httpx.put(f"{endpoint}/{bucket}", timeout=10, verify=trusted_tls()).status_code == 200
