"""``GET /v1/billing`` over real HTTP: shape, defaults, grouping, field errors."""

from __future__ import annotations

from gpuyard.api.rest.schemas import responses as schemas
from tests.helpers import LiveServer

A = "NVIDIA RTX A6000"


def test_billing_groups_and_validates(srv: LiveServer) -> None:
    with srv.client() as c:
        created = c.post("/v1/clusters", json={"gpu_type": A, "docker_image": "img"}).json()
        cid = created["data"]["id"]
        assert srv.server.reconciler.wait_idle(10)
        one = c.get(f"/v1/clusters/{cid}").json()["data"]["cost"]
        assert set(one["accrued_usd"]) == {"current_run", "lifetime"}
        assert one["since"] == created["data"]["start_initiated_at"]
        for group in ("cluster", "gpu_type", "day"):
            body = c.get("/v1/billing", params={"group_by": group}).json()
            schemas.BillingEnvelope.model_validate(body)
            assert body["data"]["group_by"] == group
        by_cluster = c.get("/v1/billing", params={"from": "2020-01-01T00:00:00Z"}).json()["data"]
        assert by_cluster["from"] == "2020-01-01T00:00:00Z"
        assert all(item["key"] == cid for item in by_cluster["items"])
        for field, params in (
            ("from", {"from": "soon"}),
            ("to", {"to": "2020-13-01"}),
            ("group_by", {"group_by": "week"}),
            ("project_id", {"project_id": "x"}),
        ):
            r = c.get("/v1/billing", params=params)
            assert r.status_code == 400 and r.json()["error"]["details"]["field"] == field
        assert c.get("/v1/billing", params={"project_id": 999999}).status_code == 404
