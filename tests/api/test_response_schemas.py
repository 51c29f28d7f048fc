"""Real responses match the documented OpenAPI schemas exactly (no extra fields)."""

from __future__ import annotations

import httpx

from gpuyard.api.rest.schemas import responses as schemas
from gpuyard.core.tls_trust import trusted_tls
from tests.helpers import LiveServer


def test_cluster_responses_match_their_schemas(srv: LiveServer) -> None:
    with srv.client() as c:
        body = {
            "name": "schema",
            "gpu_type": "NVIDIA RTX A6000",
            "docker_image": "img",
            "volume_gb": 5,
            "ports": [{"internal_port": 22}, {"internal_port": 8888, "protocol": "http"}],
        }
        created = c.post("/v1/clusters", json=body).json()
        schemas.ClusterEnvelope.model_validate(created)
        assert created["data"]["startup_progress"] is not None
        cid = created["data"]["id"]
        assert srv.server.reconciler.wait_idle(10)
        schemas.ClusterEnvelope.model_validate(c.get(f"/v1/clusters/{cid}").json())
        schemas.ClusterListEnvelope.model_validate(c.get("/v1/clusters").json())
        schemas.ClusterEnvelope.model_validate(c.post(f"/v1/clusters/{cid}/stop").json())
        assert srv.server.reconciler.wait_idle(10)
        started = c.post(
            f"/v1/clusters/{cid}/start",
            json={"wait_for_ready": True, "update_configuration": {"memory_gb": 8}},
        ).json()
        schemas.StartEnvelope.model_validate(started)
        schemas.ClusterEnvelope.model_validate(c.post(f"/v1/clusters/{cid}/restart").json())
        schemas.EventListEnvelope.model_validate(c.get(f"/v1/clusters/{cid}/events").json())
        schemas.ClusterV2.model_validate(c.get(f"/v2/clusters/{cid}").json())
        assert srv.server.reconciler.wait_idle(10)
        schemas.ClusterEnvelope.model_validate(c.delete(f"/v1/clusters/{cid}").json())

    spec = httpx.get(srv.url + "/openapi.json", timeout=60, verify=trusted_tls()).json()
    get_one = spec["paths"]["/v1/clusters/{cluster_id}"]["get"]["responses"]["200"]
    assert get_one["content"]["application/json"]["schema"]["$ref"].endswith("ClusterEnvelope")
