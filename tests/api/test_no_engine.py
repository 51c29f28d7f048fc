"""With no container engine the server still serves; a start fails at the image step
with a message that says what to install."""

from __future__ import annotations

from pathlib import Path

from gpuyard.runtimes.engines.runtime import DockerEngineRuntime
from tests.helpers import live_server, make_settings


def test_no_engine_fails_start_with_install_hint(tmp_path: Path) -> None:
    runtime = DockerEngineRuntime(f"unix://{tmp_path}/missing.sock")
    with live_server(make_settings(tmp_path / "home"), runtime) as srv, srv.client() as c:
        r = c.post("/v1/clusters", json={"docker_image": "localhost/gpuyard/busybox:latest"})
        assert r.status_code == 201, r.text
        cid = r.json()["data"]["id"]
        assert srv.server.reconciler.wait_idle(20)
        data = c.get(f"/v1/clusters/{cid}").json()["data"]
        assert data["status"] == "error"
        assert "install podman" in data["error_message"]
        hosts = c.get("/v1/hosts").json()["data"]["hosts"]
        assert hosts[0]["engine"]["reachable"] is False
        assert "install podman" in hosts[0]["engine"]["message"]
        assert c.get("/v1/gpu-types").status_code == 200
