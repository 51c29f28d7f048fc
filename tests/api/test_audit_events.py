"""``GET /v1/audit-events`` over real HTTP: each change is recorded with its actor,
membership, key, action, target and the request id its answer carried; filters,
paging, who may read it, bad parameters 400."""

from __future__ import annotations

from gpuyard.api.rest.schemas import tenancy as ts
from tests.api.test_accounts import invite_and_accept, new_account
from tests.api.test_resources import data, err
from tests.helpers import LiveServer


def test_changes_are_audited_with_actor_and_request_id(srv: LiveServer) -> None:
    made = new_account(srv)
    aid, owner = made["account"]["id"], made["api_key"]["key"]
    with srv.client(owner) as c:
        me = c.get("/v1/me").json()["data"]
        r = c.post("/v1/api-keys", json={"name": "ci", "scope": "read"})
        assert r.status_code == 201
        request_id = r.json()["meta"]["request_id"]
        key_id = r.json()["data"]["id"]
        events = data(c.get("/v1/audit-events"), 200, ts.AuditEventListEnvelope)["events"]
    created = events[0]
    assert created["action"] == "key.create"
    assert created["request_id"] == request_id
    assert created["actor"] == {"user_id": me["user"]["id"], "email": "owner@acme.test"}
    assert created["member_id"] == me["acting"]["member_id"]
    assert created["key_id"] == made["api_key"]["id"]
    assert created["target"] == {"type": "api_key", "id": str(key_id)}
    assert created["account_id"] == aid
    # The account's creation, by the operator, is in the trail too.
    first = events[-1]
    assert first["action"] == "account.create" and first["actor"]["email"] == "admin@localhost"


def test_filters_paging_and_access(srv: LiveServer) -> None:
    made = new_account(srv)
    aid, owner = made["account"]["id"], made["api_key"]["key"]
    member = invite_and_accept(srv, owner, aid, "dev@acme.test", "member")
    with srv.client(owner) as c:
        for name in ("a", "b", "c"):
            assert c.post("/v1/projects", json={"name": name}).status_code == 201
        keys = c.get("/v1/audit-events", params={"action": "project.*"}).json()["data"]
        assert [e["action"] for e in keys["events"]] == ["project.create"] * 3
        exact = c.get("/v1/audit-events", params={"action": "invitation.accept"}).json()["data"]
        assert len(exact["events"]) == 1
        assert exact["events"][0]["actor"]["email"] == "dev@acme.test"
        by_actor = c.get("/v1/audit-events", params={"actor": "dev@acme.test"}).json()["data"]
        assert {e["action"] for e in by_actor["events"]} == {"invitation.accept"}
        page = c.get("/v1/audit-events", params={"limit": 2}).json()["data"]
        assert len(page["events"]) == 2 and page["next_before_id"] is not None
        rest = c.get(
            "/v1/audit-events", params={"limit": 100, "before_id": page["next_before_id"]}
        ).json()["data"]
        ids = [e["id"] for e in page["events"] + rest["events"]]
        assert ids == sorted(ids, reverse=True) and len(set(ids)) == len(ids)
        assert rest["next_before_id"] is None
        window = c.get(
            "/v1/audit-events", params={"from": "2000-01-01", "to": "2000-01-02T00:00:00Z"}
        ).json()["data"]
        assert window["events"] == []
        err(
            c.get("/v1/audit-events", params={"from": "yesterday"}), 400, "VALIDATION_ERROR", "from"
        )
        err(c.get("/v1/audit-events", params={"to": "2025-13-01"}), 400, "VALIDATION_ERROR", "to")
        err(c.get("/v1/audit-events", params={"limit": 0}), 400, "VALIDATION_ERROR", "limit")
    with srv.client(member["api_key"]["key"]) as c:
        err(c.get("/v1/audit-events"), 403, "FORBIDDEN")
    # Another account's trail is not in this one's; the operator reads any with the header.
    other = new_account(srv, name="o", email="o@o.test")
    with srv.client(other["api_key"]["key"]) as c:
        theirs = c.get("/v1/audit-events").json()["data"]["events"]
        assert {e["account_id"] for e in theirs} == {other["account"]["id"]}
    with srv.client() as c:
        seen = c.get("/v1/audit-events", headers={"X-Gpuyard-Account": str(aid)}).json()["data"]
        assert {e["account_id"] for e in seen["events"]} == {aid}
