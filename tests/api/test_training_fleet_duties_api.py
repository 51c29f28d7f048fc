"""Fleet duties for training nodes over real HTTP: the drain's answer says which
workers go where and, per node, what stays and why; the training detail shows each
node's host and whether it answers; deleting a host that still holds training nodes
answers 409 HOST_NOT_EMPTY naming them. Fake engines per host, a training operator on
fake nodes (tests/e2e covers real Slurm)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from gpuyard.api.rest.schemas.hosts import HostDrainEnvelope
from gpuyard.cli.main import cli
from gpuyard.reconciler.training.operator import TrainingOperator
from gpuyard.runtimes.fleet import HostEngine
from gpuyard.testing.fake_nodes import FakeNodeRuntime
from gpuyard.testing.fake_runtime import FakeRuntime
from tests.api.test_training_api import public_key
from tests.helpers import LiveServer, add_host_row, live_server, make_settings, v1_error
from tests.service.test_training_operator import FakeEdge

A = "NVIDIA RTX A6000"
BASE = "/distributed_jobs_v2/cluster/"


class Engines:
    def __init__(self) -> None:
        self.by_host: dict[int, FakeRuntime] = {}

    def make(self, host: HostEngine) -> FakeRuntime:
        return self.by_host.setdefault(host.host_id, FakeRuntime())


@pytest.fixture
def engines() -> Engines:
    return Engines()


@pytest.fixture
def srv(tmp_path: Path, engines: Engines) -> Iterator[LiveServer]:
    """Heartbeats only when the test says; training clusters built on fake nodes."""
    settings = make_settings(tmp_path / "home", heartbeat_interval_s=3600)

    def operator(ctx: Any, queue: Any, fleet: Any, lane_of: Any, owns: Any) -> TrainingOperator:
        return TrainingOperator(ctx, FakeNodeRuntime(), FakeEdge(), queue=queue, owns=owns)

    with live_server(
        settings, FakeRuntime(), host_runtimes=engines.make, training_operator=operator
    ) as server:
        yield server


def wait_for(check: Any, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def short(name: str) -> str:
    """``controller`` or ``worker-N``."""
    return "controller" if name.endswith("-controller") else name[-8:]


def test_drain_answers_per_node_and_the_detail_shows_each_nodes_host(
    srv: LiveServer, engines: Engines, tmp_path: Path
) -> None:
    ctx = srv.server.ctx
    h2 = add_host_row(ctx, "h2", 4, location="lab")
    srv.server.reconciler.heartbeat_now()
    with srv.client() as c:
        key = c.post(
            "/v1/ssh-keys", json={"name": "me", "public_key": public_key(tmp_path, "k1")}
        ).json()["data"]
        projects = c.get("/v1/projects").json()["data"]
        project = (projects if isinstance(projects, list) else projects["projects"])[0]["id"]
        image = c.get("/v1/images").json()["data"]
        image_id = (image if isinstance(image, list) else image["images"])[0]["id"]
        scope = {"project_id": project, "location": "lab"}
        r = c.post(
            BASE,
            params=scope,
            json={
                "name": "trainer",
                "image_version_id": image_id,
                "ssh_key_ids": [key["id"]],
                "no_of_nodes": 2,
                "gpu_type": A,
                "gpus_per_node": 1,
                "cpus_per_node": 2,
                "memory_gb_per_node": 4,
            },
        )
        assert r.status_code in (200, 201), r.text
        cid = r.json()["data"]["id"]

        def detail() -> dict[str, Any]:
            got = c.get(f"{BASE}{cid}/", params=scope)
            assert got.status_code == 200, got.text
            data: dict[str, Any] = got.json()["data"]
            return data

        wait_for(lambda: detail()["status"] == "running")
        nodes = {short(n["name"]): n for n in detail()["nodes"]}
        assert {(n["host_id"], n["host"], n["host_status"]) for n in nodes.values()} == {
            (h2, "h2", "reachable")
        }
        h3 = add_host_row(ctx, "h3", 4, location="lab")

        r = c.post(f"/v1/hosts/{h2}/drain")
        assert r.status_code == 200, r.text
        HostDrainEnvelope.model_validate(r.json())
        moved = r.json()["data"]["drain"]["training_nodes"]
        workers = sorted(n for n in nodes if n.startswith("worker"))
        assert moved["moving"] == [
            {
                "node_id": nodes[w]["id"],
                "name": nodes[w]["name"],
                "training_cluster_id": cid,
                "to_host_id": h3,
            }
            for w in workers
        ]
        [stays] = moved["cannot_move"]
        assert stays["role"] == "controller" and stays["node_id"] == nodes["controller"]["id"]
        assert "Slurm state" in stays["reason"]

        shown = {n["name"]: n for n in detail()["nodes"]}
        assert [shown[nodes[w]["name"]]["host_id"] for w in workers] == [h3, h3]
        assert shown[nodes["controller"]["name"]]["host"] == "h2"

        # The CLI says the same (again: the controller still cannot move).
        said = CliRunner().invoke(
            cli,
            ["hosts", "drain", str(h2)],
            env={
                "GPUYARD_URL": srv.url,
                "GPUYARD_API_KEY": srv.key,
                "GPUYARD_HOME": str(ctx.settings.home),
            },
        )
        assert said.exit_code == 0, said.output
        assert f"training node {nodes['controller']['name']}: cannot move now: " in said.stdout

        # The drained host no longer answers: only the node still there shows it.
        srv.server.reconciler.heartbeat_now()
        engines.by_host[h2].unavailable = "no route to host"
        for _ in range(ctx.settings.heartbeat_misses):
            srv.server.reconciler.heartbeat_now()
        ctx.references.invalidate()
        shown = {n["name"]: n for n in detail()["nodes"]}
        assert shown[nodes["controller"]["name"]]["host_status"] == "unreachable"
        assert {shown[nodes[w]["name"]]["host_status"] for w in workers} == {"reachable"}

        err = v1_error(c.delete(f"/v1/hosts/{h2}"), 409, "HOST_NOT_EMPTY")
        assert err["details"]["left"]["training_nodes"] == [
            {
                "node_id": nodes["controller"]["id"],
                "name": nodes["controller"]["name"],
                "role": "controller",
                "training_cluster_id": cid,
            }
        ]
        assert nodes["controller"]["name"] in err["message"]
