"""The e2e server launcher (tests/e2e/serve_launcher.py) cleans up after itself."""

from __future__ import annotations

import pytest

from tests.e2e.serve_launcher import Launcher

pytestmark = pytest.mark.e2e


def test_a_launcher_started_again_removes_the_dead_ones_socket_folder() -> None:
    launcher = Launcher()
    try:
        first = launcher._started()
        assert first.exists()
        assert launcher._proc is not None
        launcher._proc.kill()
        launcher._proc.wait(timeout=30)
        second = launcher._started()
        assert second.exists()
        assert second.parent != first.parent
        assert not first.parent.exists()
    finally:
        launcher._stop()
    assert not second.parent.exists()
