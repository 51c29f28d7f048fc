"""Real-engine fixtures: a private ``podman system service`` for the session and the
offline busybox image built once."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuyard.core.errors import RuntimeFailure
from gpuyard.runtimes.devimage import build_dev_image
from gpuyard.runtimes.engine_url import PodmanService

DEV_IMAGE = "localhost/gpuyard/busybox:latest"


@pytest.fixture(scope="session")
def engine_url() -> Iterator[str]:
    # A short path under /tmp: unix socket paths are limited to 108 bytes.
    workdir = Path(tempfile.mkdtemp(prefix="gy-podman-"))
    service = PodmanService(workdir / "podman.sock")
    try:
        url = service.start()
    except RuntimeFailure as e:
        shutil.rmtree(workdir, ignore_errors=True)
        pytest.skip(f"cannot start podman system service: {e.message}")
    try:
        build_dev_image("podman", DEV_IMAGE)
        yield url
    finally:
        service.stop()
        shutil.rmtree(workdir, ignore_errors=True)
