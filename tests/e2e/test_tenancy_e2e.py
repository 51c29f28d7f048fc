"""Tenancy on real containers: an account created through the API, its prepaid balance
spent while a cluster runs (the container really stops, its volume stays, new work is
402 until a top-up), and a suspension that stops the container and a resume that lets
it start again."""

from __future__ import annotations

from pathlib import Path

import docker
import httpx

from gpuyard.core.tls_trust import trusted_tls
from tests.e2e.conftest import DEV_IMAGE
from tests.e2e.test_server_e2e import (
    ServerProcess,
    container_name,
    gone,
    running_server,
    volume_name,
    wait_status,
)

CLUSTER = {
    "name": "tenant",
    "gpu_type": "NVIDIA RTX A6000",
    "gpu_count": 1,
    "docker_image": DEV_IMAGE,
    "volume_gb": 1,
    "memory_gb": 1,
    "cpu_cores": 1,
}


def new_account(server: ServerProcess, c: httpx.Client, name: str) -> tuple[int, httpx.Client]:
    r = c.post("/v1/accounts", json={"name": name, "owner_email": f"{name}@example.com"})
    assert r.status_code == 201, r.text
    data = r.json()["data"]
    owner = httpx.Client(
        base_url=server.url,
        headers={"Authorization": f"Bearer {data['api_key']['key']}"},
        timeout=120,
        verify=trusted_tls(),
    )
    return int(data["account"]["id"]), owner


def volume_exists(engine: docker.DockerClient, server: ServerProcess, cid: str) -> bool:
    return any(v.name == volume_name(server, cid) for v in engine.volumes.list())


def test_a_spent_balance_stops_real_containers_until_a_top_up(
    tmp_path: Path, engine_url: str, engine: docker.DockerClient
) -> None:
    with running_server(tmp_path / "home", engine_url) as server, server.client() as op:
        account_id, owner = new_account(server, op, "prepaid")
        with owner:
            r = op.patch(f"/v1/accounts/{account_id}/budget", json={"billing_mode": "prepaid"})
            assert r.status_code == 200, r.text
            # Some 25 seconds of one A6000 and its compute (counted from the create):
            # time for a loaded machine to start it before the money runs out.
            credit = op.post(f"/v1/accounts/{account_id}/credits", json={"amount": 0.005})
            assert credit.status_code == 201, credit.text
            r = owner.post("/v1/clusters", json=CLUSTER)
            assert r.status_code == 201, r.text
            cid = r.json()["data"]["id"]
            assert wait_status(owner, cid, {"running", "error"})["status"] == "running"
            engine.containers.get(container_name(server, cid))

            stopped = wait_status(owner, cid, {"stopped"}, timeout=90)
            assert stopped["status"] == "stopped"
            assert gone(engine, server, cid) and volume_exists(engine, server, cid)
            events = owner.get(f"/v1/clusters/{cid}/events").json()["data"]["events"]
            stops = [e for e in events if e["to_status"] == "stopping"]
            assert stops and "exhausted" in str(stops[-1]), events

            refused = owner.post(f"/v1/clusters/{cid}/start")
            assert refused.status_code == 402, refused.text
            assert refused.json()["error"]["code"] == "BUDGET_EXHAUSTED"

            op.post(f"/v1/accounts/{account_id}/credits", json={"amount": 50, "note": "top-up"})
            started = owner.post(f"/v1/clusters/{cid}/start")
            assert started.status_code == 200, started.text
            assert wait_status(owner, cid, {"running", "error"})["status"] == "running"
            assert owner.delete(f"/v1/clusters/{cid}").status_code == 200
            wait_status(owner, cid, {"terminated"})


def test_suspension_stops_real_containers_and_resume_allows_starts(
    tmp_path: Path, engine_url: str, engine: docker.DockerClient
) -> None:
    with running_server(tmp_path / "home", engine_url) as server, server.client() as op:
        account_id, owner = new_account(server, op, "tenant")
        with owner:
            cid = owner.post("/v1/clusters", json=CLUSTER).json()["data"]["id"]
            assert wait_status(owner, cid, {"running", "error"})["status"] == "running"
            r = op.patch(
                f"/v1/accounts/{account_id}", json={"status": "suspended", "reason": "unpaid"}
            )
            assert r.status_code == 200, r.text
            wait_status(owner, cid, {"stopped"})
            assert gone(engine, server, cid) and volume_exists(engine, server, cid)
            refused = owner.post(f"/v1/clusters/{cid}/start")
            assert refused.status_code == 403
            assert refused.json()["error"]["code"] == "ACCOUNT_SUSPENDED"

            assert (
                op.patch(f"/v1/accounts/{account_id}", json={"status": "active"}).status_code == 200
            )
            assert owner.post(f"/v1/clusters/{cid}/start").status_code == 200
            assert wait_status(owner, cid, {"running", "error"})["status"] == "running"
            assert owner.delete(f"/v1/clusters/{cid}").status_code == 200
            wait_status(owner, cid, {"terminated"})
