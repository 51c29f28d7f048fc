"""``Idempotency-Key`` over real HTTP on the three create surfaces: a retry answers the
same resource with a 2xx and places nothing more; the key with another body answers
422 IDEMPOTENCY_KEY_REUSED in the surface's own envelope; a malformed key is a
VALIDATION_ERROR naming the header; OpenAPI documents the header."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import func, select

from gpuyard.core.tls_trust import trusted_tls
from gpuyard.store.schema import Cluster, GpuAllocation, TrainingCluster
from tests.api.test_training_api import public_key
from tests.helpers import LiveServer

A6000 = "NVIDIA RTX A6000"
HEADER = "Idempotency-Key"
TRAINING = "/distributed_jobs_v2/cluster/"


def rows(srv: LiveServer, model: Any) -> int:
    with srv.server.ctx.read() as session:
        return int(session.scalar(select(func.count()).select_from(model)) or 0)


def rest_create(srv: LiveServer, key: str, **extra: Any) -> httpx.Response:
    body = {"name": "once", "gpu_type": A6000, "gpu_count": 1, "docker_image": "img", **extra}
    with srv.client() as c:
        return c.post("/v1/clusters", json=body, headers={HEADER: key})


def test_rest_retry_answers_the_same_cluster(srv: LiveServer) -> None:
    first = rest_create(srv, "rest-1")
    again = rest_create(srv, "rest-1")
    assert first.status_code == again.status_code == 201, again.text
    assert again.json()["data"]["id"] == first.json()["data"]["id"]
    assert again.headers["Idempotent-Replayed"] == "true"
    assert "Idempotent-Replayed" not in first.headers
    assert rows(srv, Cluster) == 1 and rows(srv, GpuAllocation) == 1

    other = rest_create(srv, "rest-1", name="another")
    assert other.status_code == 422
    payload = other.json()
    assert payload["success"] is False
    assert payload["error"]["code"] == "IDEMPOTENCY_KEY_REUSED", payload
    assert rows(srv, Cluster) == 1

    # Another key is another cluster.
    assert rest_create(srv, "rest-2").json()["data"]["id"] != first.json()["data"]["id"]
    assert rows(srv, Cluster) == 2


def test_rest_malformed_keys_are_validation_errors(srv: LiveServer) -> None:
    for bad in ["x" * 256, ""]:
        r = rest_create(srv, bad)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["code"] == "VALIDATION_ERROR"
        assert error["details"]["field"] == HEADER
    assert rows(srv, Cluster) == 0


def graphql(srv: LiveServer, query: str, key: str | bytes | None) -> httpx.Response:
    headers: dict[str, str | bytes] = {"Authorization": f"Bearer {srv.key}"}
    if key is not None:
        headers[HEADER] = key
    return httpx.post(
        f"{srv.url}/graphql",
        json={"query": query},
        headers=headers,
        timeout=30,
        verify=trusted_tls(),
    )


def deploy_query(mutation: str, name: str, extra: str = "") -> str:
    return (
        f'mutation {{ {mutation}(input: {{gpuTypeId: "{A6000}", imageName: "img", '
        f'name: "{name}", gpuCount: 1{extra}}}) {{ id name }} }}'
    )


def test_graphql_deploy_retry_answers_the_same_pod(srv: LiveServer) -> None:
    for mutation, extra in [
        ("podFindAndDeployOnDemand", ""),
        ("clusterFindAndDeployOnDemand", ""),
        ("podRentInterruptable", ", bidPerGpu: 0.3"),
        ("clusterRentInterruptable", ", bidPerGpu: 0.3"),
    ]:
        query = deploy_query(mutation, "g", extra)
        first = graphql(srv, query, f"gql-{mutation}")
        again = graphql(srv, query, f"gql-{mutation}")
        assert first.status_code == again.status_code == 200
        assert "errors" not in first.json() and "errors" not in again.json(), again.text
        assert again.json()["data"][mutation]["id"] == first.json()["data"][mutation]["id"]

        other = graphql(srv, deploy_query(mutation, "other", extra), f"gql-{mutation}")
        assert other.status_code == 200
        body = other.json()
        assert body["data"][mutation] is None
        assert [e["extensions"]["code"] for e in body["errors"]] == ["IDEMPOTENCY_KEY_REUSED"]
    assert rows(srv, Cluster) == 4 and rows(srv, GpuAllocation) == 4

    cpu = 'mutation { deployCpuPod(input: {imageName: "img", instanceId: "cpu3c-2-4"}) { id } }'
    ids = {graphql(srv, cpu, "gql-cpu").json()["data"]["deployCpuPod"]["id"] for _ in range(2)}
    assert len(ids) == 1 and rows(srv, Cluster) == 5

    # One key names one request: the same key on another deploy mutation is refused.
    reused = graphql(srv, deploy_query("clusterFindAndDeployOnDemand", "g"), "gql-cpu").json()
    assert [e["extensions"]["code"] for e in reused["errors"]] == ["IDEMPOTENCY_KEY_REUSED"]


def test_graphql_malformed_key_is_a_validation_error(srv: LiveServer) -> None:
    latin1 = "caf\u00e9".encode("latin-1")  # not ASCII
    body = graphql(srv, deploy_query("podFindAndDeployOnDemand", "g"), latin1).json()
    assert body["errors"][0]["extensions"]["code"] == "VALIDATION_ERROR"
    assert body["errors"][0]["extensions"]["details"]["field"] == HEADER
    # Queries ignore the header.
    ok = graphql(srv, "{ myself { id } }", "x" * 300).json()
    assert "errors" not in ok, ok
    assert rows(srv, Cluster) == 0


def training_setup(srv: LiveServer, tmp_path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    with srv.client() as c:
        key = c.post(
            "/v1/ssh-keys", json={"name": "me", "public_key": public_key(tmp_path, "k1")}
        ).json()["data"]
        images = c.get("/v1/images").json()["data"]
        image = images[0] if isinstance(images, list) else images["images"][0]
        projects = c.get("/v1/projects").json()["data"]
        project = (projects if isinstance(projects, list) else projects["projects"])[0]
    body = {
        "name": "trainer",
        "image_version_id": image["id"],
        "ssh_key_ids": [key["id"]],
        "no_of_nodes": 1,
        "gpu_type": A6000,
        "gpus_per_node": 1,
        "cpus_per_node": 2,
        "memory_gb_per_node": 4,
    }
    return {"project_id": project["id"], "location": "local"}, body


def test_training_retry_answers_the_same_cluster(srv: LiveServer, tmp_path: Path) -> None:
    params, body = training_setup(srv, tmp_path)
    with srv.client() as c:
        first = c.post(TRAINING, params=params, json=body, headers={HEADER: "train-1"})
        again = c.post(TRAINING, params=params, json=body, headers={HEADER: "train-1"})
        assert first.status_code == again.status_code == 201, again.text
        assert again.json()["data"]["id"] == first.json()["data"]["id"]
        allocations = rows(srv, GpuAllocation)
        assert rows(srv, TrainingCluster) == 1 and allocations >= 1

        changed = c.post(
            TRAINING, params=params, json={**body, "name": "other"}, headers={HEADER: "train-1"}
        )
        payload = changed.json()
        assert changed.status_code == payload["code"] == 422, payload
        assert payload["errors"]["code"] == "IDEMPOTENCY_KEY_REUSED"
        assert payload["data"] == {}

        bad = c.post(TRAINING, params=params, json=body, headers={HEADER: "x" * 256})
        assert bad.status_code == 400 and bad.json()["errors"]["field"] == HEADER
    assert rows(srv, TrainingCluster) == 1 and rows(srv, GpuAllocation) == allocations


def test_openapi_documents_the_header(srv: LiveServer) -> None:
    spec = httpx.get(f"{srv.url}/openapi.json", timeout=30, verify=trusted_tls()).json()
    # /graphql is not in OpenAPI (its contract is the GraphQL schema; see api/app.py).
    assert "/graphql" not in spec["paths"]
    for path in ["/v1/clusters", TRAINING]:
        params = spec["paths"][path]["post"].get("parameters", [])
        header = [p for p in params if p["name"] == HEADER]
        assert header and header[0]["in"] == "header", (path, params)
        assert "IDEMPOTENCY_KEY_REUSED" in header[0]["description"]
    assert "422" in spec["paths"]["/v1/clusters"]["post"]["responses"]
