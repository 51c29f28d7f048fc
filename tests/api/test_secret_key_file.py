"""A missing secret key file is a first start only while nothing is sealed: once the
store holds sealed values, the server refuses to start with a new key (every stored
secret would be unreadable) and says which file to restore."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuyard.services.installation.bootstrap import open_store
from gpuyard.services.tenancy.secrets import SecretKeyError
from gpuyard.testing.fake_runtime import FakeRuntime
from tests.helpers import live_server, make_settings


def test_a_lost_key_stops_the_start_instead_of_replacing_it(tmp_path: Path) -> None:
    settings = make_settings(tmp_path / "home")
    with live_server(settings, FakeRuntime()) as srv, srv.client() as c:
        body = {
            "gpu_type": "NVIDIA RTX A6000",
            "gpu_count": 1,
            "docker_image": "img",
            "env": {"DB_PASSWORD": "hunter2"},
        }
        assert c.post("/v1/clusters", json=body).status_code == 201
    key = settings.secret_key_path
    key.unlink()
    with pytest.raises(SecretKeyError, match="restore the key file"):
        open_store(settings)
    assert not key.exists()  # no new key took its place


def test_a_first_start_makes_the_key(tmp_path: Path) -> None:
    settings = make_settings(tmp_path / "home")
    engine, _ = open_store(settings)
    engine.dispose()
    assert settings.secret_key_path.exists()
