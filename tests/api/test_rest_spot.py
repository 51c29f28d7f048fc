"""Spot through REST: interruptible create, preemption visible, bid-resume."""

from __future__ import annotations

from gpuyard.api.rest.schemas import responses as schemas
from tests.helpers import LiveServer

A = "NVIDIA RTX A6000"


def test_spot_over_rest(srv: LiveServer) -> None:
    with srv.client() as c:
        low = c.post(
            "/v1/clusters",
            json={"gpu_type": A, "gpu_count": 4, "docker_image": "img", "volume_gb": 5,
                  "interruptible": True, "bid_per_gpu": 0.40},
        ).json()["data"]  # fmt: skip
        assert low["interruptible"] and low["bid_per_gpu"] == 0.40
        assert low["cost"]["breakdown"]["gpu"] == 1.6  # 4 x the bid, not the list price
        refused = c.post(
            "/v1/clusters",
            json={"gpu_type": A, "docker_image": "img", "bid_per_gpu": 0.01},
        )
        assert refused.status_code == 400
        assert refused.json()["error"]["details"]["field"] == "bid_per_gpu"
        assert srv.server.reconciler.wait_idle(10)

        boss = c.post("/v1/clusters", json={"gpu_type": A, "gpu_count": 4, "docker_image": "img"})
        assert boss.status_code == 201
        assert srv.server.reconciler.wait_idle(10)
        victim = c.get(f"/v1/clusters/{low['id']}").json()["data"]
        assert victim["status"] == "stopped"
        assert f"preempted by cluster {boss.json()['data']['id']}" in victim["last_status_change"]
        events = c.get(f"/v1/clusters/{low['id']}/events").json()["data"]["events"]
        assert any("preempted by" in e["message"] for e in events)

        full = c.post(f"/v1/clusters/{low['id']}/bid-resume", json={"bid_per_gpu": 0.9})
        assert full.status_code == 409  # on-demand holders are never preempted
        assert full.json()["error"]["code"] == "INSUFFICIENT_CAPACITY"
        c.delete(f"/v1/clusters/{boss.json()['data']['id']}")
        assert srv.server.reconciler.wait_idle(10)
        resumed = c.post(
            f"/v1/clusters/{low['id']}/bid-resume", json={"bid_per_gpu": 0.45, "gpu_count": 2}
        )
        assert resumed.status_code == 200, resumed.text
        body = schemas.StartEnvelope.model_validate(resumed.json())
        assert body.data.bid_per_gpu == 0.45 and body.data.gpu_count == 2


def test_auto_terminate_policy_can_change_while_running(srv: LiveServer) -> None:
    with srv.client() as c:
        cid = c.post("/v1/clusters", json={"docker_image": "img"}).json()["data"]["id"]
        assert srv.server.reconciler.wait_idle(10)
        r = c.put(f"/v1/clusters/{cid}/auto-terminate", json={"max_runtime_hours": 5})
        assert r.status_code == 200, r.text
        block = schemas.ClusterEnvelope.model_validate(r.json()).data.auto_terminate
        assert block["enabled"] and block["next_rule"] == "max_runtime"
        bad = c.put(f"/v1/clusters/{cid}/auto-terminate", json={"idle_minutes": -1})
        assert bad.status_code == 400
        assert bad.json()["error"]["details"]["field"] == "idle_minutes"
