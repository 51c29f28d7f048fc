"""RunPod's v2 clusters of type SLURM over gpuyard's training clusters, over real HTTP
with a training operator on fake Slurm nodes (as tests/api/test_training_fleet_duties_api.py):
create, list, get, the nodes as pods, rename and delete, each answer held to RunPod's
document; other types refused; another account's key sees none of them."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from gpuyard.api.http.problems import RUNPOD_V2_PREFIX as V2
from gpuyard.reconciler.training.operator import TrainingOperator
from gpuyard.store.schema import GpuAllocation, TrainingCluster
from gpuyard.testing.fake_nodes import FakeNodeRuntime
from gpuyard.testing.fake_runtime import FakeRuntime
from tests.api.test_runpod_v2_resources import ok, other_key, public_key, refused
from tests.helpers import LiveServer, live_server, make_settings
from tests.service.test_training_operator import FakeEdge

A6000 = "NVIDIA RTX A6000"


@pytest.fixture
def tsrv(tmp_path: Path) -> Iterator[LiveServer]:
    """Training clusters built on fake nodes."""
    settings = make_settings(tmp_path / "home")

    def operator(ctx: Any, queue: Any, fleet: Any, lane_of: Any, owns: Any) -> TrainingOperator:
        return TrainingOperator(ctx, FakeNodeRuntime(), FakeEdge(), queue=queue, owns=owns)

    with live_server(settings, FakeRuntime(), training_operator=operator) as server:
        yield server


def wait_for(check: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def allocated_gpus(srv: LiveServer) -> int:
    with srv.server.ctx.read() as session:
        return int(session.scalar(select(func.count()).select_from(GpuAllocation)) or 0)


def body(**extra: Any) -> dict[str, Any]:
    return {
        "name": "slurm-a",
        "type": "SLURM",
        "compute": {"gpuTypeId": A6000, "gpuCountPerPod": 1, "podCount": 2},
        **extra,
    }


def test_slurm_cluster_create_get_pods_rename_delete(tsrv: LiveServer, tmp_path: Path) -> None:
    with tsrv.client() as c:
        # No SSH key yet: nobody could log in, so the create is refused naming keys.
        p = refused(c.post(f"{V2}/clusters", json=body()), 400, "POST", "/v2/clusters")
        assert p["errors"] == ["keys"]
        c.put(f"{V2}/account/ssh-keys", json={"keys": [public_key(tmp_path, "me")]})

        made = ok(c.post(f"{V2}/clusters", json=body()), "POST", "/v2/clusters", 201)
        assert made["type"] == "SLURM" and made["name"] == "slurm-a"
        assert made["compute"] == {"gpuTypeId": A6000, "gpuCountPerPod": 1, "podCount": 2}
        assert made["pods"]["total"] == 3  # two GPU nodes and the controller
        assert made["dataCenterId"] == "local"
        assert allocated_gpus(tsrv) == 2
        cid = made["id"]

        def running() -> bool:
            got = c.get(f"{V2}/clusters/{cid}").json()
            return bool(got["pods"]["byStatus"].get("RUNNING") == 3)

        wait_for(running)
        got = ok(c.get(f"{V2}/clusters/{cid}"), "GET", "/v2/clusters/{id}")
        assert got["primary"]["status"] == "RUNNING" and "sshEndpoint" in got["primary"]
        assert "cidr" in got["network"]
        listed = ok(c.get(f"{V2}/clusters"), "GET", "/v2/clusters")
        assert [x["id"] for x in listed["clusters"]] == [cid]
        # The same cluster on seed 002's surface.
        projects = c.get("/v1/projects").json()["data"]
        projects = projects if isinstance(projects, list) else projects["projects"]
        seed = c.get(
            f"/distributed_jobs_v2/cluster/{cid}/",
            params={"project_id": projects[0]["id"], "location": "local"},
        ).json()["data"]
        assert seed["no_of_nodes"] == 2 and seed["plan"]["gpu_type"] == A6000

        pods = ok(c.get(f"{V2}/clusters/{cid}/pods"), "GET", "/v2/clusters/{id}/pods")["pods"]
        roles = [p["cluster"]["role"] for p in pods]
        assert roles == ["SLURM_CONTROLLER", "SLURM_COMPUTE", "SLURM_COMPUTE"]
        assert pods[0]["ssh"]["direct"]["port"] > 0
        assert all(p["gpu"] == {"id": A6000, "count": 1} for p in pods[1:])

        renamed = ok(
            c.patch(f"{V2}/clusters/{cid}", json={"name": "slurm-b"}), "PATCH", "/v2/clusters/{id}"
        )
        assert renamed["name"] == "slurm-b"
        for bad in ({}, {"name": ""}, {"name": "x", "compute": {}}):
            refused(c.patch(f"{V2}/clusters/{cid}", json=bad), 422, "PATCH", "/v2/clusters/{id}")

        r = c.delete(f"{V2}/clusters/{cid}")
        assert r.status_code == 204, r.text

        def gone() -> bool:
            with tsrv.server.ctx.read() as session:
                row = session.get(TrainingCluster, int(cid))
                return row is not None and row.deleted_at is not None

        wait_for(gone)
        assert allocated_gpus(tsrv) == 0
        refused(c.get(f"{V2}/clusters/{cid}"), 404, "GET", "/v2/clusters/{id}")
        assert c.get(f"{V2}/clusters").json() == {"clusters": []}


@pytest.mark.parametrize("kind", ["APPLICATION", "TRAINING", "RAY"])
def test_other_cluster_types_are_a_422_naming_type(tsrv: LiveServer, kind: str) -> None:
    with tsrv.client() as c:
        p = refused(c.post(f"{V2}/clusters", json=body(type=kind)), 422, "POST", "/v2/clusters")
        assert p["errors"] == ["type"] and "only SLURM" in p["detail"]


def test_cluster_bad_input_is_refused_naming_the_v2_field(tsrv: LiveServer, tmp_path: Path) -> None:
    with tsrv.client() as c:
        c.put(f"{V2}/account/ssh-keys", json={"keys": [public_key(tmp_path, "me")]})
        compute = {"gpuTypeId": "no such gpu", "gpuCountPerPod": 1, "podCount": 2}
        p = refused(
            c.post(f"{V2}/clusters", json=body(compute=compute)), 400, "POST", "/v2/clusters"
        )
        assert p["errors"] == ["compute.gpuTypeId"]
        p = refused(
            c.post(f"{V2}/clusters", json=body(dataCenterIds=["mars"])), 400, "POST", "/v2/clusters"
        )
        assert p["errors"] == ["dataCenterIds"]
        p = refused(
            c.post(f"{V2}/clusters", json=body(image="nope:1")), 400, "POST", "/v2/clusters"
        )
        assert p["errors"] == ["image"]
        too_many = {"gpuTypeId": A6000, "gpuCountPerPod": 4, "podCount": 3}
        p = refused(
            c.post(f"{V2}/clusters", json=body(compute=too_many)), 409, "POST", "/v2/clusters"
        )
        assert p["code"] == "INSUFFICIENT_CAPACITY"
        one = {"gpuTypeId": A6000, "gpuCountPerPod": 1, "podCount": 1}
        refused(c.post(f"{V2}/clusters", json=body(compute=one)), 422, "POST", "/v2/clusters")
        assert c.get(f"{V2}/clusters").json() == {"clusters": []}
        assert allocated_gpus(tsrv) == 0


def test_another_account_sees_none_of_the_clusters(tsrv: LiveServer, tmp_path: Path) -> None:
    with tsrv.client() as c:
        c.put(f"{V2}/account/ssh-keys", json={"keys": [public_key(tmp_path, "me")]})
        cid = c.post(f"{V2}/clusters", json=body()).json()["id"]
    theirs = other_key(tsrv)
    with tsrv.client(theirs) as c:
        for method, suffix in (("GET", ""), ("GET", "/pods"), ("DELETE", "")):
            path = "/v2/clusters/{id}" + suffix
            refused(c.request(method, f"{V2}/clusters/{cid}{suffix}"), 404, method, path)
        refused(
            c.patch(f"{V2}/clusters/{cid}", json={"name": "theirs"}),
            404,
            "PATCH",
            "/v2/clusters/{id}",
        )
        assert c.get(f"{V2}/clusters").json() == {"clusters": []}
    with tsrv.client() as c:
        assert c.get(f"{V2}/clusters/{cid}").json()["name"] == "slurm-a"
        assert c.delete(f"{V2}/clusters/{cid}").status_code == 204
