"""Every request body of seed 000 verbatim against the real app over HTTP."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from gpuyard.core.tls_trust import trusted_tls
from tests.helpers import LiveServer

SEED_BASIC = {"wait_for_ready": True, "timeout_minutes": 15}
SEED_WITH_UPDATES = {
    "wait_for_ready": True,
    "update_configuration": {
        "memory_gb": 512,
        "docker_image": "pytorch/pytorch:2.2-cuda12.1-devel",
    },
    "environment_updates": {"BATCH_SIZE": "64", "LEARNING_RATE": "0.001"},
    "auto_terminate_updates": {"enabled": True, "idle_minutes": 30},
}
SEED_SNAPSHOT = {
    "wait_for_ready": False,
    "restore_from_snapshot": "snap_xyz789",
    "port_mapping_updates": [
        {"internal_port": 8888, "external_port": 0, "protocol": "tcp", "description": "Jupyter Lab"}
    ],
}
SEED_SCHEDULED = {
    "wait_for_ready": False,
    "update_configuration": {},
    "environment_updates": {"BATCH_JOB_ID": "job-1", "START_TIME": "2024-01-15T16:00:00"},
    "auto_terminate_updates": {"enabled": True, "max_runtime_hours": 8, "cost_limit_usd": 100.0},
}


def stopped_cluster(srv: LiveServer, c: httpx.Client, name: str, **extra: Any) -> str:
    body = {
        "name": name,
        "gpu_type": "NVIDIA RTX A6000",
        "gpu_count": 1,
        "memory_gb": 256,
        "docker_image": "pytorch:2.1",
        "volume_gb": 100,
        **extra,
    }
    r = c.post("/v1/clusters", json=body)
    assert r.status_code == 201, r.text
    cid: str = r.json()["data"]["id"]
    assert srv.server.reconciler.wait_idle(10)
    assert c.post(f"/v1/clusters/{cid}/stop").status_code == 200
    assert srv.server.reconciler.wait_idle(10)
    return cid


def test_seed_start_bodies(srv: LiveServer, fake_runtime: Any) -> None:
    fake_runtime.ensure_image("pytorch/pytorch:2.2-cuda12.1-devel")
    with srv.client() as c:
        cid = stopped_cluster(srv, c, "ml-training-cluster")
        r = c.post(f"/v1/clusters/{cid}/start", json=SEED_BASIC)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["success"] is True and body["meta"]["wait_for_ready"] is True
        assert body["data"]["status"] == "running" and body["meta"]["wait_timed_out"] is False

        c.post(f"/v1/clusters/{cid}/stop")
        assert srv.server.reconciler.wait_idle(10)
        r = c.post(f"/v1/clusters/{cid}/start", json=SEED_WITH_UPDATES)
        data = r.json()["data"]
        assert data["status"] == "running"
        assert data["configuration_updates_applied"][:2] == [
            "memory_gb: 256 -> 512",
            "docker_image: pytorch:2.1 -> pytorch/pytorch:2.2-cuda12.1-devel",
        ]
        assert data["env"]["BATCH_SIZE"] == "64"
        assert data["auto_terminate"]["idle_minutes"] == 30
        cost = data["cost"]
        assert {
            "new_hourly_rate",
            "previous_hourly_rate",
            "rate_change_reason",
            "hourly_rate",
        } <= set(cost)

        c.post(f"/v1/clusters/{cid}/stop")
        assert srv.server.reconciler.wait_idle(10)
        r = c.post(f"/v1/clusters/{cid}/start", json=SEED_SNAPSHOT)
        assert r.status_code == 404 and r.json()["error"]["code"] == "SNAPSHOT_NOT_FOUND"
        # The refused start changed nothing.
        assert c.get(f"/v1/clusters/{cid}").json()["data"]["status"] == "stopped"
        without_snapshot = {k: v for k, v in SEED_SNAPSHOT.items() if k != "restore_from_snapshot"}
        r = c.post(f"/v1/clusters/{cid}/start", json=without_snapshot)
        data = r.json()["data"]
        assert data["status"] == "starting"
        assert data["startup_progress"]["total_steps"] == 8
        assert {"phase", "percentage", "current_step", "steps_completed"} <= set(
            data["startup_progress"]
        )
        assert (
            data["ports"][0]["description"] == "Jupyter Lab"
            and data["ports"][0]["external_port"] > 0
        )
        assert srv.server.reconciler.wait_idle(10)

        c.post(f"/v1/clusters/{cid}/stop")
        assert srv.server.reconciler.wait_idle(10)
        r = c.post(f"/v1/clusters/{cid}/start", json=SEED_SCHEDULED)
        assert r.status_code == 200, r.text
        assert r.json()["data"]["auto_terminate"]["max_runtime_hours"] == 8


def test_seed_python_and_js_flows(srv: LiveServer) -> None:
    """The seed's start_dev_environment and resumeTrainingJob flows."""
    with srv.client() as c:
        cid = stopped_cluster(srv, c, "dev-u42", ports=[{"internal_port": 22}])
        stopped_cluster(srv, c, "training-job7")
        clusters = c.get(
            "/v1/clusters", params={"project_id": 1, "search": "dev-u42", "status": "stopped"}
        ).json()["data"]["clusters"]
        assert [x["id"] for x in clusters] == [cid]
        r = c.post(
            f"/v1/clusters/{cid}/start",
            json={
                "wait_for_ready": True,
                "timeout_minutes": 10,
                "environment_updates": {
                    "USER_ID": "u42",
                    "PROJECT_ID": "1",
                    "WORKSPACE": "/workspace/u42",
                },
                "auto_terminate_updates": {"enabled": True, "idle_minutes": 120},
            },
        ).json()
        ssh = r["data"]["network"]["ssh_connection"]
        # Through the SSH gateway; straight to the container's sshd beside it.
        assert r["success"] and ssh["connection_string"] == f"ssh {cid}@127.0.0.1 -p 2222"
        assert ssh["direct"].startswith("ssh root@127.0.0.1 -p ")
        assert r["data"]["network"]["proxy_url"] is None  # nothing HTTP is exposed
        found = c.get("/v1/clusters?search=training-job7&status=stopped").json()
        assert found["success"] and len(found["data"]["clusters"]) == 1
        tid = found["data"]["clusters"][0]["id"]
        r = c.post(
            f"/v1/clusters/{tid}/start",
            json={
                "wait_for_ready": True,
                "timeout_minutes": 15,
                "environment_updates": {"RESUME_FROM_CHECKPOINT": "/ckpt", "JOB_ID": "7"},
                "update_configuration": {},
                "auto_terminate_updates": {
                    "enabled": True,
                    "cost_limit_usd": 500.0,
                    "idle_minutes": 30,
                },
            },
        ).json()
        assert r["success"] and r["data"]["id"] == tid
        assert isinstance(r["data"]["cost"]["hourly_rate"], float)


def test_v2_start_and_get(srv: LiveServer) -> None:
    with srv.client() as c:
        cid = stopped_cluster(srv, c, "v2")
        # The seed's v2 curl sends no body, only the bare Authorization header.
        r = httpx.post(
            f"{srv.url}/v2/clusters/{cid}/start",
            headers={"Authorization": srv.key},
            verify=trusted_tls(),
        )
        assert r.status_code == 200, r.text
        body = r.json()
        assert set(body) >= {
            "id",
            "name",
            "status",
            "gpuType",
            "containerDiskSize",
            "volumeSize",
            "createdAt",
        }
        assert body["status"] in ("starting", "running") and body["volumeSize"] == 100
        assert srv.server.reconciler.wait_idle(10)
        assert c.get(f"/v2/clusters/{cid}").json()["status"] == "running"


def test_32_concurrent_http_creates_for_4_gpus(srv: LiveServer) -> None:
    def create(i: int) -> int:
        with srv.client() as c:
            return c.post(
                "/v1/clusters",
                json={"gpu_type": "NVIDIA RTX A6000", "gpu_count": 1, "docker_image": "img"},
            ).status_code

    with ThreadPoolExecutor(max_workers=32) as pool:
        codes = list(pool.map(create, range(32)))
    assert codes.count(201) == 4 and codes.count(409) == 28
    with srv.client() as c:
        indices = [x["gpu_indices"][0] for x in c.get("/v1/clusters").json()["data"]["clusters"]]
    assert sorted(indices) == [0, 1, 2, 3]
