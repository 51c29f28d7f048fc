"""A NUL character anywhere in a request (path, query, JSON body, GraphQL query or
variables) is answered 400 VALIDATION_ERROR in the surface's own envelope, naming where
it is, before it can reach the store (PostgreSQL refuses NUL in text; SQLite would
keep it: the answer is the same on both)."""

from __future__ import annotations

from typing import Any

import httpx

from gpuyard.core.tls_trust import trusted_tls
from tests.helpers import LiveServer

TRAINING = "/distributed_jobs_v2/cluster/"


def v1_error(r: httpx.Response, field: str) -> None:
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == "VALIDATION_ERROR" and field in error["message"], error


def test_rest_v1_paths_queries_and_bodies(srv: LiveServer) -> None:
    with srv.client() as c:
        v1_error(c.get("/v1/clusters", params={"search": "a\x00b"}), "search")
        v1_error(c.get("/v1/clusters/abc%00def"), "path")  # the polled fast path too
        r = c.post(
            "/v1/clusters",
            json={"name": "a\x00b", "gpu_type": "NVIDIA RTX A6000", "docker_image": "img"},
        )
        v1_error(r, "name")
        r = c.post(
            "/v1/clusters",
            json={"gpu_type": "NVIDIA RTX A6000", "docker_image": "img", "env": {"K\x00": "v"}},
        )
        v1_error(r, "env.K")
        v1_error(c.post("/v1/projects", json={"name": "p\x00"}), "name")
        # Nothing was stored on the way.
        assert c.get("/v1/clusters").json()["data"]["clusters"] == []


def test_training_envelope(srv: LiveServer) -> None:
    with srv.client() as c:
        r = c.get(TRAINING, params={"project_id": 1, "location": "lo\x00cal"})
        payload: dict[str, Any] = r.json()
        assert r.status_code == 400 == payload["code"], payload
        assert payload["errors"]["field"] == "location" and payload["data"] == {}
        r = c.post(TRAINING, params={"project_id": 1, "location": "local"}, json={"name": "x\x00"})
        assert r.status_code == 400 and r.json()["errors"]["field"] == "name", r.text


def test_graphql_query_and_variables(srv: LiveServer) -> None:
    def post(body: dict[str, Any]) -> httpx.Response:
        return httpx.post(
            f"{srv.url}/graphql",
            json=body,
            headers={"Authorization": f"Bearer {srv.key}"},
            verify=trusted_tls(),
        )

    literal = 'mutation { podStop(input: {podId: "ab\\u0000c"}) { id } }'
    for r in (
        post({"query": literal}),
        post(
            {
                "query": "query($id: String!) { pod(input: {podId: $id}) { id } }",
                "variables": {"id": "ab\x00c"},
            }
        ),
    ):
        assert r.status_code == 400, r.text
        error = r.json()["errors"][0]
        assert error["extensions"]["code"] == "VALIDATION_ERROR" and "NUL" in error["message"]
