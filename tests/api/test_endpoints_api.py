"""Serverless endpoints over real HTTP: ``/v1/endpoints`` (v1 envelope, cursor pages,
answers validated against their OpenAPI models, clear 4xx for bad input), and another
account's attempts at an endpoint's ids and at lending its template and volume."""

from __future__ import annotations

from typing import Any

import httpx

from gpuyard.api.rest.schemas import endpoints as schemas
from gpuyard.core.secret_env import MASK
from gpuyard.services.tenancy.auth import Scope, create_account, issue_key
from tests.helpers import LiveServer, v1_error

A6000 = "NVIDIA RTX A6000"
ENDPOINT = {
    "name": "echo",
    "image": "img:1",
    "gpu_type_ids": [A6000],
    "workers_max": 4,
    "env": {"MODE": "dev", "HF_TOKEN": "hf_secret"},
    "locations": ["local"],
}


def other_key(srv: LiveServer, email: str = "b@example.com") -> str:
    with srv.server.ctx.transaction() as session:
        user, account, _ = create_account(session, email=email, name=email)
        return issue_key(
            session, user_id=user.id, account_id=account.id, name="b", scope=Scope.WRITE
        ).key


def ok(r: httpx.Response, status: int = 200) -> Any:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["success"] is True
    return body["data"]


def test_create_list_get_patch_delete(srv: LiveServer) -> None:
    with srv.client() as c:
        created = c.post("/v1/endpoints", json=ENDPOINT)
        schemas.EndpointEnvelope.model_validate(created.json())
        made = ok(created, 201)
        eid = made["id"]
        assert made["env"] == {"MODE": "dev", "HF_TOKEN": MASK}
        assert made["status"] == "active" and made["version"] == 1
        assert made["workers"] == {"running": 0, "idle": 0, "starting": 0}
        assert made["jobs"] == {"inQueue": 0, "inProgress": 0}
        assert (made["idle_timeout_s"], made["scaler_type"], made["scaler_value"]) == (
            5,
            "QUEUE_DELAY",
            4,
        )
        assert ok(c.get(f"/v1/endpoints/{eid}")) == made

        listed = c.get("/v1/endpoints")
        schemas.EndpointListEnvelope.model_validate(listed.json())
        assert [e["id"] for e in ok(listed)["endpoints"]] == [eid]

        changed = ok(
            c.patch(
                f"/v1/endpoints/{eid}",
                json={"workers_min": 1, "scaler_type": "REQUEST_COUNT", "env": {"HF_TOKEN": MASK}},
            )
        )
        schemas.Endpoint.model_validate(changed)
        assert changed["version"] == 2 and changed["workers_min"] == 1
        assert changed["env"] == {"HF_TOKEN": MASK} and changed["scaler_type"] == "REQUEST_COUNT"

        deleted = c.delete(f"/v1/endpoints/{eid}")
        schemas.EndpointDeletedEnvelope.model_validate(deleted.json())
        assert ok(deleted) == {"id": eid, "deleted": True, "status": "deleting"}
        v1_error(c.get(f"/v1/endpoints/{eid}"), 404, "ENDPOINT_NOT_FOUND")
        assert ok(c.get("/v1/endpoints"))["endpoints"] == []
        # The name is free again.
        assert ok(c.post("/v1/endpoints", json=ENDPOINT), 201)["id"] != eid


def test_pages_by_cursor(srv: LiveServer) -> None:
    with srv.client() as c:
        ids = [
            ok(c.post("/v1/endpoints", json={**ENDPOINT, "name": f"e{i}"}), 201)["id"]
            for i in range(3)
        ]
        first = ok(c.get("/v1/endpoints", params={"per_page": 2}))
        assert len(first["endpoints"]) == 2 and first["pagination"]["total"] == 3
        cursor = first["pagination"]["next_cursor"]
        rest = ok(c.get("/v1/endpoints", params={"per_page": 2, "cursor": cursor}))
        assert sorted(e["id"] for e in first["endpoints"] + rest["endpoints"]) == sorted(ids)
        assert rest["pagination"]["next_cursor"] is None
        v1_error(c.get("/v1/endpoints", params={"cursor": "nonsense"}), 400, "VALIDATION_ERROR")


def test_bad_input_is_a_clear_error(srv: LiveServer) -> None:
    with srv.client() as c:
        ok(c.post("/v1/endpoints", json=ENDPOINT), 201)
        v1_error(c.post("/v1/endpoints", json=ENDPOINT), 409, "ENDPOINT_EXISTS")
        for body, field in (
            ({"name": "x", "gpu_type_ids": [A6000]}, "image"),
            ({**ENDPOINT, "name": "x", "workers_min": 5, "workers_max": 2}, "workers_max"),
            ({**ENDPOINT, "name": "x", "workers_max": 1000}, "workers_max"),
            ({**ENDPOINT, "name": "x", "gpu_type_ids": ["B9000"]}, "gpu_type_ids"),
            ({**ENDPOINT, "name": "x", "locations": ["mars"]}, "locations"),
            ({**ENDPOINT, "name": "x", "image": "evil.example.com/x"}, "image"),
        ):
            r = c.post("/v1/endpoints", json=body)
            assert v1_error(r, 400, "VALIDATION_ERROR")["details"]["field"] == field, body
        for body in (
            {**ENDPOINT, "name": "x", "scaler_type": "RPS"},
            {**ENDPOINT, "name": "x", "idle_timeout_s": 0},
            {**ENDPOINT, "name": "x", "workers_min": -1},
            {**ENDPOINT, "name": "x", "gpu_count": "1"},
            {**ENDPOINT, "name": "x", "nope": 1},
            {**ENDPOINT, "name": ""},
        ):
            v1_error(c.post("/v1/endpoints", json=body), 400, "VALIDATION_ERROR")
        v1_error(c.patch("/v1/endpoints/nothing", json={}), 404, "ENDPOINT_NOT_FOUND")
        assert c.get("/v1/endpoints/" + "x" * 300).status_code in (400, 404, 422)
        v1_error(c.get("/v1/endpoints/" + "x" * 300), 400)


def test_another_account_reads_none_and_lends_nothing(srv: LiveServer) -> None:
    with srv.client() as a:
        eid = ok(a.post("/v1/endpoints", json=ENDPOINT), 201)["id"]
        template = ok(a.post("/v1/templates", json={"name": "t", "docker_image": "img"}), 201)
        volume = ok(
            a.post("/v1/networkvolumes", json={"name": "v", "size": 5, "dataCenterId": "local"}),
            201,
        )
    with srv.client(other_key(srv)) as b:
        for method in ("GET", "PATCH", "DELETE"):
            json = {"workers_max": 1} if method == "PATCH" else None
            theirs = b.request(method, f"/v1/endpoints/{eid}", json=json)
            nothing = b.request(method, "/v1/endpoints/nothing0000001", json=json)
            assert v1_error(theirs, 404, "ENDPOINT_NOT_FOUND")["message"].replace(
                eid, "?"
            ) == v1_error(nothing, 404)["message"].replace("nothing0000001", "?")
        assert ok(b.get("/v1/endpoints"))["endpoints"] == []
        lent = {**ENDPOINT, "template_id": template["id"]}
        del lent["image"]
        v1_error(b.post("/v1/endpoints", json=lent), 404, "TEMPLATE_NOT_FOUND")
        v1_error(
            b.post("/v1/endpoints", json={**ENDPOINT, "network_volume_id": volume["id"]}),
            404,
            "NETWORK_VOLUME_NOT_FOUND",
        )
    with srv.client() as a:
        assert ok(a.get(f"/v1/endpoints/{eid}"))["version"] == 1
