"""GPUYARD_HOME and what it holds are the owner's only, whatever the umask: the home
0700, the SQLite database with its -wal and -shm, the credentials, the host id and the
secret key 0600, on a fresh home and on one an older version left readable."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuyard.api.app import build_server
from gpuyard.testing.fake_runtime import FakeRuntime
from tests.helpers import make_settings

PRIVATE = ("gpuyard.db", "gpuyard.db-wal", "gpuyard.db-shm", "credentials", "host-id", "secret.key")


@pytest.fixture
def loose_umask() -> Iterator[None]:
    old = os.umask(0o022)  # the usual default: files 0644, directories 0755
    try:
        yield
    finally:
        os.umask(old)


def modes(home: Path) -> dict[str, int]:
    return {name: stat.S_IMODE((home / name).stat().st_mode) for name in (".", *PRIVATE)}


def expected() -> dict[str, int]:
    return {".": 0o700, **dict.fromkeys(PRIVATE, 0o600)}


def serve_once(home: Path) -> dict[str, int]:
    """Build the real server on ``home`` (migrations, first start, host registration:
    all of them write) and read the modes while its store is open (the -wal and -shm
    files exist only then)."""
    server = build_server(make_settings(home), FakeRuntime(), run_reconciler=False)
    try:
        return modes(home)
    finally:
        server.ctx.sessions.kw["bind"].dispose()


def test_a_fresh_home_is_private(tmp_path: Path, loose_umask: None) -> None:
    home = tmp_path / "home"
    assert serve_once(home) == expected()


def test_a_home_left_readable_is_made_private_at_start(tmp_path: Path, loose_umask: None) -> None:
    home = tmp_path / "home"
    serve_once(home)
    # What an older version (or a careless copy) left behind.
    os.chmod(home, 0o755)
    for name in PRIVATE:
        path = home / name
        if not path.exists():
            path.touch()
        os.chmod(path, 0o644)
    assert serve_once(home) == expected()
