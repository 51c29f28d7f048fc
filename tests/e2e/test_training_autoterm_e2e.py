"""Auto-termination of a training cluster end to end: the real server, real Podman
node containers running real Slurm. A cluster whose queue stays empty is stopped
after its idle time by the server's watcher (``squeue`` on the controller): its node
containers go, its Slurm state volume stays, and the account hears of it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest

from gpuyard.runtimes.slurm.image import SLURM_IMAGE
from tests.e2e.test_server_e2e import ServerProcess
from tests.e2e.test_training_e2e import BASE, Ssh, slurm_images  # noqa: F401 (fixture)
from tests.helpers import free_port

pytestmark = pytest.mark.e2e

IDLE_MINUTES = 0.1  # six seconds without a running or pending job


@pytest.fixture
def server(tmp_path: Path, engine_url: str, slurm_images: str) -> Iterator[ServerProcess]:  # noqa: F811
    srv = ServerProcess(tmp_path / "home", engine_url, free_port())
    srv.extra_env = {
        "GPUYARD_TRAINING_BIND_ADDRESS": "127.0.0.1",
        "GPUYARD_IDLE_SAMPLE_INTERVAL_S": "0.5",
    }
    srv.start()
    try:
        yield srv
    finally:
        srv.cleanup()


def wait_status(c: httpx.Client, url: str, params: dict[str, Any], want: str) -> Any:
    deadline = time.monotonic() + 300
    while True:
        data = c.get(url, params=params).json()["data"]
        if data["status"] == want:
            return data
        assert data["status"] != "error", data
        assert time.monotonic() < deadline, data
        time.sleep(0.5)


def test_a_training_cluster_with_no_jobs_stops_after_its_idle_time(
    server: ServerProcess, engine_url: str, tmp_path: Path
) -> None:
    engine = docker.DockerClient(base_url=engine_url)
    _, pub = Ssh(tmp_path).keygen("idle")
    with server.client() as c:
        projects = c.get("/v1/projects").json()["data"]["projects"]
        params = {"project_id": projects[0]["id"], "location": "local"}
        key = c.post("/v1/ssh-keys", json={"name": "idle", "public_key": pub}).json()["data"]
        images = c.get("/v1/images").json()["data"]["images"]
        image = next(i for i in images if i["image"] == SLURM_IMAGE)
        created = c.post(
            BASE,
            params=params,
            json={
                "name": "idle",
                "image_version_id": image["id"],
                "ssh_key_ids": [key["id"]],
                "no_of_nodes": 1,
                "gpu_type": "NVIDIA RTX A6000",
                "gpus_per_node": 1,
                "cpus_per_node": 1,
                "memory_gb_per_node": 1,
                "auto_terminate": {"idle_minutes": IDLE_MINUTES},
            },
        )
        assert created.status_code == 201, created.json()
        cid = created.json()["data"]["id"]
        url = f"{BASE}{cid}/"
        prefix = server.installation.training_prefix(cid)

        stopped = wait_status(c, url, params, "stopped")
        assert stopped["status_reason"] == (
            f"auto-stopped: idle for {IDLE_MINUTES:g} min (no running or pending Slurm job)"
        )
        assert stopped["price_per_hour"] == 0
        history = c.get(f"{url}events/", params=params).json()["data"]
        assert [e["to_status"] for e in history if e["to_status"]][-3:] == [
            "running",
            "stopping",
            "stopped",
        ]
        assert any(e["message"].startswith("rule idle due at") for e in history)
        # The nodes are gone; the Slurm state (the queue) is kept for a start.
        for name in (f"{prefix}-controller", f"{prefix}-worker-1"):
            with pytest.raises(docker.errors.NotFound):
                engine.containers.get(name)
        engine.volumes.get(f"{prefix}-slurmstate")
        accounts = c.get("/v1/accounts").json()["data"]
        aid = (accounts if isinstance(accounts, list) else accounts["accounts"])[0]["id"]
        events = c.get(f"/v1/accounts/{aid}/events").json()["data"]["events"]
        fired = [e for e in events if e["kind"] == "training.auto_terminated"]
        assert len(fired) == 1 and fired[0]["detail"]["training_cluster_id"] == cid

        assert c.delete(url, params=params).status_code == 200
        deadline = time.monotonic() + 120
        while c.get(url, params=params).status_code != 404:
            assert time.monotonic() < deadline, "deleted"
            time.sleep(0.5)
