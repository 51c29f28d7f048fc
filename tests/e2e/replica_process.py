"""``gpuyard serve`` processes of one installation for end-to-end tests: several
replicas on one database and one engine (tests/e2e/test_replicas.py,
tests/e2e/test_database_failover.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import httpx

from gpuyard.core.tls_trust import trusted_tls
from tests.helpers import free_port

T = TypeVar("T")


class Replica:
    """One ``gpuyard serve`` process of the shared installation: ``gpus`` A6000s on
    the local host, leases of ``lease_ttl_s``; ``env`` adds or overrides settings."""

    def __init__(
        self,
        name: str,
        home: Path,
        engine_url: str,
        database_url: str,
        *,
        gpus: int,
        lease_ttl_s: float,
        env: dict[str, str] | None = None,
    ) -> None:
        self.name, self.home = name, home
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # Named server.log, so a failed test's report shows its warnings (conftest.py).
        self.log = home.parent / name / "server.log"
        self.env = {
            **os.environ,
            "GPUYARD_HOME": str(home),
            # The HTTP proxy and SSH gateway listen on fixed ports: not needed here.
            "GPUYARD_PROXY_ENABLED": "false",
            "GPUYARD_SSH_PORT": "0",
            "GPUYARD_PORT": str(self.port),
            "GPUYARD_DATABASE_URL": database_url,
            "GPUYARD_ENGINE_URL": engine_url,
            "GPUYARD_LOCAL_GPUS": f"NVIDIA RTX A6000:{gpus}",
            "GPUYARD_LOCAL_VCPUS": str(max(32, 2 * gpus)),
            "GPUYARD_LOCAL_MEMORY_GB": str(max(256, 4 * gpus)),
            "GPUYARD_LOCAL_DISK_GB": str(max(1000, 40 * gpus)),
            "GPUYARD_RECONCILE_INTERVAL_S": "0.5",
            "GPUYARD_STOP_TIMEOUT_S": "2",
            "GPUYARD_LEASE_TTL_S": str(lease_ttl_s),
            "GPUYARD_TRAINING_ENABLED": "false",
            # Container disk sizes cannot be enforced on this machine's ext4 storage.
            "GPUYARD_ALLOW_UNENFORCED_DISK": "true",
            **(env or {}),
        }
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "gpuyard", "serve"],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def wait_up(self) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.proc is not None and self.proc.poll() is None, self.tail()
            try:
                if (
                    httpx.get(f"{self.url}/healthz", timeout=1, verify=trusted_tls()).status_code
                    == 200
                ):
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"{self.name} did not come up:\n{self.tail()}")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""

    def client(self, timeout: float = 60) -> httpx.Client:
        key = json.loads((self.home / "credentials").read_text())["api_key"]
        return httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {key}"},
            timeout=timeout,
            verify=trusted_tls(),
        )


def eventually(check: Callable[[], T | None], timeout: float, what: str) -> T:
    """``check()`` once it answers something other than None; AssertionError after
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found is not None:
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)
