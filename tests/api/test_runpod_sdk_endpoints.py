"""RunPod's Python SDK, unmodified, deploying serverless endpoints through gpuyard's
GraphQL: ``create_template(is_serverless=True)``, ``create_endpoint`` (RunPod's pool
names and catalog ids), ``get_endpoints``, ``update_endpoint_template``; then
``saveEndpoint`` updates, ``deleteEndpoint`` and ``serverlessDiscount`` as RunPod's
API has them, and another account trying the ids."""

from __future__ import annotations

from typing import Any

import pytest

from gpuyard.services.tenancy.auth import Scope, create_account, issue_key
from tests.helpers import LiveServer
from tests.required_parts import need_module

runpod = need_module("runpod", how="pip install runpod (make venv)")


@pytest.fixture
def sdk(srv: LiveServer, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("RUNPOD_API_BASE_URL", srv.url)
    monkeypatch.setattr(runpod, "api_key", srv.key)
    return runpod


def other_key(srv: LiveServer) -> str:
    with srv.server.ctx.transaction() as session:
        user, account, _ = create_account(session, email="b@example.com", name="b")
        return issue_key(
            session, user_id=user.id, account_id=account.id, name="b", scope=Scope.WRITE
        ).key


def codes(body: dict[str, Any]) -> list[str]:
    return [e["extensions"]["code"] for e in body.get("errors") or []]


def test_sdk_deploys_an_endpoint(srv: LiveServer, sdk: Any) -> None:
    template = sdk.create_template("worker", "img:1", is_serverless=True, env={"MODE": "x"})
    assert template["isServerless"] is True
    made = sdk.create_endpoint(
        "echo",
        template["id"],
        gpu_ids="AMPERE_48",
        idle_timeout=7,
        scaler_type="REQUEST_COUNT",
        scaler_value=2,
        workers_min=0,
        workers_max=2,
        flashboot=True,
    )
    eid = made["id"]
    assert made["templateId"] == template["id"] and made["flashBootType"] == "FLASHBOOT"
    assert "NVIDIA RTX A6000" in made["gpuIds"].split(",")
    assert (made["idleTimeout"], made["scalerType"], made["scalerValue"]) == (
        7,
        "REQUEST_COUNT",
        2,
    )
    assert (made["workersMin"], made["workersMax"], made["gpuCount"]) == (0, 2, 1)
    assert made["networkVolumeId"] is None and made["locations"] is None

    listed = sdk.get_endpoints()
    assert [e["id"] for e in listed] == [eid]
    assert listed[0]["env"] == [{"key": "MODE", "value": "x"}] and listed[0]["version"] == 1
    assert listed[0]["type"] == "QB"

    with srv.client() as c:
        rest = c.get(f"/v1/endpoints/{eid}").json()["data"]
        assert rest["image"] == "img:1" and rest["flashboot"] is True

    second = sdk.create_template("worker2", "img:2", is_serverless=True)
    moved = sdk.update_endpoint_template(eid, second["id"])
    assert moved == {"id": eid, "templateId": second["id"]}
    assert sdk.get_endpoints()[0]["version"] == 2

    # A catalog id works as well as a pool; an unknown one is a clear error.
    sdk.create_endpoint("by-id", template["id"], gpu_ids="NVIDIA RTX A6000")
    with pytest.raises(runpod.error.QueryError, match="gpuIds"):
        sdk.create_endpoint("bad", template["id"], gpu_ids="NVIDIA B9000")
    with pytest.raises(runpod.error.QueryError, match="already exists"):
        sdk.create_endpoint("echo", template["id"])

    update = srv.graphql(
        'mutation($id: String!) { saveEndpoint(input: {id: $id, workersMax: 3, gpuIds: "ADA_24"}) '
        "{ id workersMax gpuIds version } }",
        {"id": eid},
    )
    saved = update["data"]["saveEndpoint"]
    assert saved["workersMax"] == 3 and saved["version"] == 3
    assert "NVIDIA GeForce RTX 4090" in saved["gpuIds"]
    discount = srv.graphql("{ myself { serverlessDiscount { discountFactor } } }")
    assert discount["data"]["myself"] == {"serverlessDiscount": None}

    gone = srv.graphql("mutation($id: String!) { deleteEndpoint(id: $id) }", {"id": eid})
    assert "errors" not in gone
    assert [e["name"] for e in sdk.get_endpoints()] == ["by-id"]
    again = srv.graphql("mutation($id: String!) { deleteEndpoint(id: $id) }", {"id": eid})
    assert codes(again) == ["ENDPOINT_NOT_FOUND"]


def test_another_account_sees_none(srv: LiveServer, sdk: Any) -> None:
    template = sdk.create_template("worker", "img:1", is_serverless=True)
    eid = sdk.create_endpoint("echo", template["id"], gpu_ids="AMPERE_48")["id"]
    key = other_key(srv)
    mine = srv.graphql("{ myself { endpoints { id } } }", key=key)
    assert mine["data"]["myself"]["endpoints"] == []
    for query in (
        "mutation($id: String!) { deleteEndpoint(id: $id) }",
        "mutation($id: String!) { saveEndpoint(input: {id: $id, workersMax: 1}) { id } }",
    ):
        assert codes(srv.graphql(query, {"id": eid}, key=key)) == ["ENDPOINT_NOT_FOUND"]
    lend = (
        'mutation($t: String!) { saveEndpoint(input: {name: "x", templateId: $t, '
        'gpuIds: "AMPERE_48"}) { id } }'
    )
    assert codes(srv.graphql(lend, {"t": template["id"]}, key=key)) == ["TEMPLATE_NOT_FOUND"]
    assert [e["id"] for e in sdk.get_endpoints()] == [eid]


def test_an_endpoints_network_volume_names_its_data_center(srv: LiveServer, sdk: Any) -> None:
    with srv.client() as c:
        r = c.post(
            "/v1/networkvolumes", json={"name": "models", "size": 10, "dataCenterId": "local"}
        )
        assert r.status_code == 201, r.text
        vid = r.json()["data"]["id"]
    template = sdk.create_template("worker", "img:1", is_serverless=True)
    saved = srv.graphql(
        'mutation($t: String!, $v: String!) { saveEndpoint(input: {name: "vol", templateId: $t, '
        'gpuIds: "AMPERE_48", networkVolumeId: $v}) { id networkVolume { id dataCenterId } } }',
        {"t": template["id"], "v": vid},
    )["data"]["saveEndpoint"]
    assert saved["networkVolume"] == {"id": vid, "dataCenterId": "local"}
    listed = srv.graphql("{ myself { endpoints { networkVolume { id dataCenterId } } } }")
    assert listed["data"]["myself"]["endpoints"] == [
        {"networkVolume": {"id": vid, "dataCenterId": "local"}}
    ]
