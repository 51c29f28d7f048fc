"""A restic helper image that cannot be made sends the operation to the tar stream
(NotHere), unless the engine itself fails (then the stream would fail too). A stand-in
SDK client: the engine answers pings and refuses the image import."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import docker.errors
import pytest

from gpuyard.core.errors import RuntimeFailure
from gpuyard.core.ownership import Ownership
from gpuyard.runtimes.engines.engine import Engine
from gpuyard.runtimes.volumes.fifo_stream import NotHere
from gpuyard.runtimes.volumes.restic_helper import helper_image


class _Api:
    def __init__(self) -> None:
        self.answers_ping = True

    def inspect_image(self, name: str) -> Any:
        raise docker.errors.ImageNotFound(f"no such image: {name}")

    def import_image_from_data(self, data: bytes, **kwargs: Any) -> Any:
        raise docker.errors.APIError("importing refused: no space left on device")


class _Client:
    def __init__(self) -> None:
        self.api = _Api()

    def ping(self) -> bool:
        if not self.api.answers_ping:
            raise docker.errors.APIError("engine gone")
        return True


@pytest.fixture
def restic(tmp_path: Path) -> str:
    binary = tmp_path / "restic"
    binary.write_bytes(b"#!/bin/sh\n")  # ldd: not a dynamic executable
    binary.chmod(0o755)
    return str(binary)


def test_an_image_the_engine_will_not_take_streams_instead(restic: str) -> None:
    engine = Engine("unix:///nonexistent.sock", owner=Ownership.new(), client=_Client())
    with pytest.raises(NotHere, match="no restic helper image"):
        helper_image(engine, restic)


def test_an_engine_that_fails_fails_the_operation(restic: str) -> None:
    client = _Client()
    client.api.answers_ping = False
    engine = Engine("unix:///nonexistent.sock", owner=Ownership.new(), client=client)
    with pytest.raises(RuntimeFailure) as failed:
        helper_image(engine, restic)
    assert not isinstance(failed.value, NotHere)
