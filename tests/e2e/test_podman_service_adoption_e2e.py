"""A Podman service that outlived the server that started it (killed with SIGKILL) is
adopted by the next start on the same socket, not doubled: the second start answers the
same URL at once and starts nothing."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from gpuyard.runtimes.engines.url import PodmanService, ping_unix_socket
from tests.required_parts import needs_tools

pytestmark = [
    pytest.mark.e2e,
    needs_tools("podman", how="apt-get install podman runc (bash scripts/setup-system.sh)"),
]


def test_a_running_service_on_the_socket_is_adopted() -> None:
    workdir = Path(tempfile.mkdtemp(prefix="gy-adopt-"))  # short: socket paths <= 108 bytes
    first = PodmanService(workdir / "podman.sock")
    try:
        url = first.start()
        second = PodmanService(workdir / "podman.sock")
        assert second.start() == url
        assert not second.running  # nothing of its own was started
        assert first.running and ping_unix_socket(str(workdir / "podman.sock"))
        second.stop()  # not its to stop
        assert first.running
    finally:
        first.stop()
        shutil.rmtree(workdir, ignore_errors=True)
