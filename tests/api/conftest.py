from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuyard.testing.fake_runtime import FakeRuntime
from tests.helpers import LiveServer, live_server, make_settings


@pytest.fixture
def fake_runtime() -> FakeRuntime:
    return FakeRuntime()


@pytest.fixture
def srv(tmp_path: Path, fake_runtime: FakeRuntime) -> Iterator[LiveServer]:
    """The real app over real HTTP, on SQLite, with the fake runtime."""
    with live_server(make_settings(tmp_path / "home"), fake_runtime) as server:
        yield server
