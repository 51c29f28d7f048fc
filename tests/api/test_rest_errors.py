"""Every error path answers its code in the v1 envelope (and never a 500)."""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest

from gpuyard.core.tls_trust import trusted_tls
from gpuyard.services.tenancy.auth import Scope, create_account, issue_key
from tests.helpers import LiveServer

A6000 = "NVIDIA RTX A6000"


def err(r: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["success"] is False and body["error"]["code"] == code, body
    assert body["meta"]["request_id"].startswith("req_")
    return dict(body["error"])


def key_for(srv: LiveServer, email: str, scope: Scope = Scope.WRITE) -> str:
    with srv.server.ctx.transaction() as s:
        user, account, _ = create_account(s, email=email, name=email)
        return issue_key(s, user_id=user.id, account_id=account.id, name="k", scope=scope).key


def test_auth_forms(srv: LiveServer) -> None:
    with httpx.Client(base_url=srv.url, verify=trusted_tls()) as c:
        err(c.get("/v1/clusters"), 401, "UNAUTHORIZED")
        err(c.get("/v1/clusters", headers={"Authorization": "Bearer nope"}), 401, "UNAUTHORIZED")
        assert (
            c.get("/v1/clusters", headers={"Authorization": f"Bearer {srv.key}"}).status_code == 200
        )
        assert c.get("/v1/clusters", headers={"Authorization": srv.key}).status_code == 200
        assert c.get("/v1/clusters", params={"api_key": srv.key}).status_code == 200


def test_revoked_and_read_only_keys(srv: LiveServer) -> None:
    ro = key_for(srv, "ro@example.com", Scope.READ)
    with srv.client(ro) as c:
        assert c.get("/v1/clusters").status_code == 200
        err(c.post("/v1/clusters", json={"docker_image": "img"}), 403, "FORBIDDEN")
        err(c.get("/v1/hosts"), 403, "FORBIDDEN")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"docker_image": "img", "gpu_count": "two"}, "gpu_count"),
        ({"docker_image": "img", "volume_gb": -1}, "volume_gb"),
        ({"docker_image": "img", "gpu_type": "NVIDIA Imaginary 9000"}, "gpu_type"),
        ({"docker_image": "img", "ports": [{"internal_port": 70000}]}, "ports[0].internal_port"),
        (
            {"docker_image": "img", "ports": [{"internal_port": 80, "protocol": "sctp"}]},
            "ports[0].protocol",
        ),
        ({"docker_image": "img", "env": {"1BAD": "x"}}, "env"),
        ({"docker_image": "img", "env": {"A": 3}}, "env.A"),
        ({"gpu_count": 1}, "docker_image"),
        ({"docker_image": "img", "unknown_field": 1}, "unknown_field"),
        ({"docker_image": "img", "volume_mount_path": "relative"}, "volume_mount_path"),
        ({"docker_image": "img", "cloud_type": "MOON"}, "cloud_type"),
    ],
)
def test_create_validation(srv: LiveServer, body: dict[str, Any], field: str) -> None:
    with srv.client() as c:
        e = err(c.post("/v1/clusters", json=body), 400, "VALIDATION_ERROR")
    assert e["details"]["field"] == field
    assert field in e["message"]


def test_bad_json_and_unknown_routes(srv: LiveServer) -> None:
    with srv.client() as c:
        r = c.post(
            "/v1/clusters", content=b"{not json", headers={"Content-Type": "application/json"}
        )
        err(r, 400, "VALIDATION_ERROR")
        err(c.get("/v1/nothing-here"), 404, "NOT_FOUND")
        err(c.put("/v1/clusters"), 405, "METHOD_NOT_ALLOWED")
        err(c.get("/v1/clusters", params={"page": 0}), 400, "VALIDATION_ERROR")
        # Found by fuzzing: integers past the store's range were a 500.
        err(c.get("/v1/clusters", params={"page": 10**22}), 400, "VALIDATION_ERROR")
        err(c.get("/v1/clusters", params={"project_id": 2**40}), 400, "VALIDATION_ERROR")
        big = {"docker_image": "img", "project_id": 2**40}
        err(c.post("/v1/clusters", json=big), 400, "VALIDATION_ERROR")


def test_state_capacity_snapshot_and_isolation(srv: LiveServer) -> None:
    with srv.client() as c:
        created = c.post(
            "/v1/clusters", json={"gpu_type": A6000, "gpu_count": 2, "docker_image": "img"}
        )
        assert created.status_code == 201, created.text
        cid = created.json()["data"]["id"]
        assert srv.server.reconciler.wait_idle(10)
        e = err(
            c.post(f"/v1/clusters/{cid}/start", json={"wait_for_ready": True}), 409, "INVALID_STATE"
        )
        assert e["details"] == {
            "current_status": "running",
            "required_status": "stopped",
            "allowed_actions": ["stop", "restart", "terminate"],
            "suggestion": "Stop the cluster first or wait for it to finish current operations",
        }
        e = err(
            c.post("/v1/clusters", json={"gpu_type": A6000, "gpu_count": 3, "docker_image": "img"}),
            409,
            "INSUFFICIENT_CAPACITY",
        )
        assert e["details"]["requested"]["gpu_count"] == 3
        assert e["details"]["available"][0]["gpus"][A6000] == 2
        # "stopped" too: the woken reconciler may finish before the answer is read.
        assert c.post(f"/v1/clusters/{cid}/stop").json()["data"]["status"] in {
            "stopping",
            "stopped",
        }
        assert srv.server.reconciler.wait_idle(10)
        e = err(
            c.post(f"/v1/clusters/{cid}/start", json={"restore_from_snapshot": "snap_xyz789"}),
            404,
            "SNAPSHOT_NOT_FOUND",
        )
        e = err(
            c.post(f"/v1/clusters/{cid}/start", json={"update_configuration": {"storage_gb": -5}}),
            400,
            "VALIDATION_ERROR",
        )
        assert e["details"]["field"] == "update_configuration.storage_gb"
        err(
            c.post(f"/v1/clusters/{cid}/start", json={"timeout_minutes": 31}),
            400,
            "VALIDATION_ERROR",
        )
        err(c.post(f"/v1/clusters/{cid}/restart"), 409, "INVALID_STATE")
    other = key_for(srv, "mallory@example.com")
    with srv.client(other) as c:
        err(c.get(f"/v1/clusters/{cid}"), 404, "CLUSTER_NOT_FOUND")
        err(c.post(f"/v1/clusters/{cid}/stop"), 404, "CLUSTER_NOT_FOUND")
        err(c.delete(f"/v1/clusters/{cid}"), 404, "CLUSTER_NOT_FOUND")
        err(c.get(f"/v2/clusters/{cid}"), 404, "CLUSTER_NOT_FOUND")
        assert c.get("/v1/clusters").json()["data"]["clusters"] == []
        err(c.post("/v1/clusters", json={"docker_image": "img", "project_id": 1}), 404, "NOT_FOUND")


def test_openapi_lists_the_endpoints(srv: LiveServer) -> None:
    spec = httpx.get(srv.url + "/openapi.json", timeout=60, verify=trusted_tls()).json()
    for path in (
        "/v1/clusters",
        "/v1/clusters/{cluster_id}/start",
        "/v2/clusters/{cluster_id}/start",
        "/v1/gpu-types",
        "/v1/hosts",
        "/v1/clusters/{cluster_id}/events",
    ):
        assert path in spec["paths"]
    start = spec["paths"]["/v1/clusters/{cluster_id}/start"]["post"]
    assert "requestBody" in start
    assert httpx.get(srv.url + "/docs", verify=trusted_tls()).status_code == 200


def test_the_api_reference_page_needs_no_internet(srv: LiveServer) -> None:
    page = httpx.get(srv.url + "/docs", verify=trusted_tls())
    assert page.status_code == 200 and "swagger-ui" in page.text
    assets = re.findall(r'(?:src|href)="(/[^"]+)"', page.text)
    assert any(a.endswith(".js") for a in assets) and any(a.endswith(".css") for a in assets)
    assert "cdn" not in page.text.lower() and "http" not in "".join(assets)
    for asset in assets:
        r = httpx.get(srv.url + asset, verify=trusted_tls())
        assert r.status_code == 200 and len(r.content) > 100, asset
