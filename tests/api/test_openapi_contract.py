"""The OpenAPI document says what the server does: 405s carry ``Allow`` naming every
method of the path, integer path ids are declared as integers, seed 002's routes
declare their required query parameters, bodies and error statuses, and every REST
route declares the error statuses it answers. (The fuzz run, tests/api/test_fuzz.py,
checks all of it at scale; these pin each fix.)"""

from __future__ import annotations

from typing import Any

from tests.helpers import LiveServer

TRAINING = "/distributed_jobs_v2/cluster/"


def _openapi(srv: LiveServer) -> dict[str, Any]:
    with srv.client() as c:
        doc: dict[str, Any] = c.get("/openapi.json").json()
    return doc


def test_405_names_every_method_of_the_path(srv: LiveServer) -> None:
    with srv.client() as c:
        # GET (fast path and route) and DELETE are two routes of one path.
        r = c.request("TRACE", "/v1/clusters/abcdefghijklmn")
        assert r.status_code == 405
        assert r.headers["allow"] == "GET, DELETE"
        assert r.json()["error"]["code"] == "METHOD_NOT_ALLOWED"
        r = c.patch("/v1/ssh-keys/1")
        assert r.status_code == 405
        assert r.headers["allow"] == "GET, DELETE"
        # Seed 002's paths answer in their own envelope.
        r = c.request("TRACE", TRAINING)
        assert r.status_code == 405
        assert r.headers["allow"] == "GET, POST"
        assert r.json()["code"] == 405


def test_path_ids_are_declared_and_checked_as_integers(srv: LiveServer) -> None:
    doc = _openapi(srv)
    params = doc["paths"]["/v1/ssh-keys/{ssh_key_id}"]["get"]["parameters"]
    schema = next(p for p in params if p["name"] == "ssh_key_id")["schema"]
    assert schema["type"] == "integer"
    assert schema["minimum"] == 1
    with srv.client() as c:
        for bad in ("abc", "0", "99999999999999999999"):
            r = c.get(f"/v1/ssh-keys/{bad}")
            assert r.status_code == 400, bad
            assert r.json()["error"]["details"]["field"] == "ssh_key_id"


def test_training_routes_declare_scope_body_and_errors(srv: LiveServer) -> None:
    doc = _openapi(srv)
    create = doc["paths"][TRAINING]["post"]
    required = {p["name"] for p in create["parameters"] if p.get("required")}
    assert {"project_id", "location"} <= required
    assert "400" in create["responses"] and "201" in create["responses"]
    body = create["requestBody"]["content"]["application/json"]["schema"]
    assert set(body["required"]) == {"name", "image_version_id", "ssh_key_ids", "no_of_nodes"}
    get_one = doc["paths"][TRAINING + "{Cluster_Id}/"]["get"]
    cluster_id = next(p for p in get_one["parameters"] if p["name"] == "Cluster_Id")
    assert cluster_id["schema"]["type"] == "integer"
    with srv.client() as c:
        r = c.get(TRAINING + "0/", params={"project_id": 1, "location": "local"})
        assert r.status_code == 400
        assert r.json()["errors"]["field"] == "Cluster_Id"
        r = c.get(TRAINING, params={"project_id": 2**31, "location": "local"})
        assert r.status_code == 400
        assert r.json()["errors"]["field"] == "project_id"


def test_training_bodies_take_integral_numbers_as_integers(srv: LiveServer) -> None:
    """JSON Schema counts 274.0 as an integer; so does the server."""
    with srv.client() as c:
        body = {"action": "add_security_group", "security_groups_ids": [274.0]}
        r = c.put(TRAINING + "7/", params={"project_id": 1, "location": "local"}, json=body)
        # Past the body's checks: the cluster does not exist.
        assert r.status_code == 404, r.text


def test_rest_routes_declare_their_error_statuses(srv: LiveServer) -> None:
    doc = _openapi(srv)
    for path, methods in doc["paths"].items():
        if path == "/healthz":
            continue
        for method, op in methods.items():
            for status in ("400", "401", "404", "413", "429"):
                assert status in op["responses"], (method, path, status)
            # FastAPI's own 422 shape is never sent (validation errors are 400s).
            assert "HTTPValidationError" not in str(op["responses"].get("422", ""))
