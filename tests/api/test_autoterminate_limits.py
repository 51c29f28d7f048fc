"""Auto-termination policies cannot poison anything: unbounded values are refused in
each surface's envelope (nothing stored), and a policy stored before the bounds held
it breaks no read and no start. The live server fails any test that saw a 5xx."""

from __future__ import annotations

import math
from typing import Any

import httpx
import pytest
from sqlalchemy import update

from gpuyard.core.tls_trust import trusted_tls
from gpuyard.store.schema import Cluster
from tests.helpers import LiveServer

BOUNDS = {"idle_minutes": "525,600", "max_runtime_hours": "8,760", "cost_limit_usd": "1,000,000"}
REFUSED = [
    ('{"cost_limit_usd": 1e300}', "cost_limit_usd"),
    ('{"cost_limit_usd": 1e999}', "cost_limit_usd"),  # parses as infinity
    ('{"cost_limit_usd": NaN}', "cost_limit_usd"),
    ('{"max_runtime_hours": Infinity}', "max_runtime_hours"),
    ('{"max_runtime_hours": 8761}', "max_runtime_hours"),
    ('{"idle_minutes": true}', "idle_minutes"),
    ('{"idle_minutes": "30"}', "idle_minutes"),
    ('{"max_runtime_hours": -1}', "max_runtime_hours"),
    ('{"cost_limit_usd": 0}', "cost_limit_usd"),
    ('{"action": null}', "action"),
    ('{"action": "delete"}', "action"),
    ('{"enabled": null}', "enabled"),
]


def _cluster(c: httpx.Client, srv: LiveServer, **extra: Any) -> str:
    r = c.post("/v1/clusters", json={"docker_image": "img", **extra})
    assert r.status_code == 201, r.text
    assert srv.server.reconciler.wait_idle(10)
    cid: str = r.json()["data"]["id"]
    return cid


def test_put_refuses_unbounded_values_and_stores_nothing(srv: LiveServer) -> None:
    with srv.client() as c:
        cid = _cluster(c, srv)
        ok = c.put(f"/v1/clusters/{cid}/auto-terminate", json={"max_runtime_hours": 5})
        assert ok.status_code == 200, ok.text
        before = c.get(f"/v1/clusters/{cid}").json()["data"]["auto_terminate"]
        for raw, field in REFUSED:
            r = c.put(
                f"/v1/clusters/{cid}/auto-terminate",
                content=raw,
                headers={"content-type": "application/json"},
            )
            assert r.status_code == 400, (raw, r.text)
            error = r.json()["error"]
            assert error["code"] == "VALIDATION_ERROR" and error["details"]["field"] == field
            if field in BOUNDS:
                assert f"greater than 0 and at most {BOUNDS[field]}" in error["message"], raw
        after = c.get(f"/v1/clusters/{cid}").json()["data"]["auto_terminate"]
        assert after == before


def test_create_and_start_refuse_unbounded_policies(srv: LiveServer) -> None:
    with srv.client() as c:
        bad = c.post(
            "/v1/clusters",
            json={
                "docker_image": "img",
                "auto_terminate": {"enabled": True, "cost_limit_usd": 1e300},
            },
        )
        assert bad.status_code == 400, bad.text
        assert bad.json()["error"]["details"]["field"] == "auto_terminate.cost_limit_usd"
        assert c.get("/v1/clusters").json()["data"]["clusters"] == []  # nothing stored
        cid = _cluster(c, srv)
        assert c.post(f"/v1/clusters/{cid}/stop").status_code == 200
        assert srv.server.reconciler.wait_idle(10)
        r = c.post(
            f"/v1/clusters/{cid}/start",
            json={"auto_terminate_updates": {"max_runtime_hours": 1, "action": None}},
        )
        assert r.status_code == 400, r.text
        assert r.json()["error"]["details"]["field"] == "auto_terminate_updates.action"
        assert c.get(f"/v1/clusters/{cid}").json()["data"]["status"] == "stopped"


@pytest.mark.parametrize("when", ["9999-12-31T00:00:00Z", "2200-01-01T00:00:00Z", "soon"])
def test_graphql_deadlines_are_bounded(srv: LiveServer, when: str) -> None:
    query = (
        'mutation { podFindAndDeployOnDemand(input: {imageName: "x", gpuCount: 0, '
        f'stopAfter: "{when}"}}) {{ id }} }}'
    )
    r = httpx.post(
        f"{srv.url}/graphql",
        json={"query": query},
        headers={"Authorization": f"Bearer {srv.key}"},
        timeout=30,
        verify=trusted_tls(),
    )
    assert r.status_code == 200, r.text
    errors = r.json()["errors"]
    assert errors[0]["extensions"]["code"] == "VALIDATION_ERROR"
    assert "stopAfter" in errors[0]["message"]


# What a server stored before the bounds existed (SQLite's JSON keeps NaN too).
POISON: list[Any] = [
    {"enabled": True, "cost_limit_usd": 1e300, "action": "stop"},
    {"enabled": True, "max_runtime_hours": 1, "action": None},
    {"enabled": True, "idle_minutes": math.nan, "action": "stop"},
    "garbage",
]


def _poison(srv: LiveServer, cid: str, raw: Any) -> None:
    with srv.server.ctx.transaction() as session:
        session.execute(
            update(Cluster)
            .where(Cluster.id == cid)
            .values(auto_terminate=raw, version=Cluster.version + 1)
        )


@pytest.mark.parametrize("raw", POISON, ids=["1e300", "action-null", "nan", "not-an-object"])
def test_a_poisoned_stored_policy_breaks_no_read(srv: LiveServer, raw: Any) -> None:
    with srv.client() as c:
        cid = _cluster(c, srv)
        assert c.get(f"/v1/clusters/{cid}").json()["data"]["status"] == "running"
        _poison(srv, cid, raw)
        one = c.get(f"/v1/clusters/{cid}")
        assert one.status_code == 200, one.text
        block = one.json()["data"]["auto_terminate"]
        assert block["error"] and block["next_deadline_at"] is None
        listed = c.get("/v1/clusters")
        assert listed.status_code == 200
        assert [x["id"] for x in listed.json()["data"]["clusters"]] == [cid]
        assert c.get(f"/v2/clusters/{cid}").status_code == 200
        gql = httpx.post(
            f"{srv.url}/graphql",
            json={
                "query": f'{{ pod(input: {{podId: "{cid}"}}) {{ id desiredStatus }} '
                "myself { pods { id } } }"
            },
            headers={"Authorization": f"Bearer {srv.key}"},
            timeout=30,
            verify=trusted_tls(),
        )
        assert gql.status_code == 200 and "errors" not in gql.json(), gql.text
        assert gql.json()["data"]["pod"]["id"] == cid


def test_start_after_a_stored_null_action_works(srv: LiveServer) -> None:
    with srv.client() as c:
        cid = _cluster(c, srv)
        assert c.post(f"/v1/clusters/{cid}/stop").status_code == 200
        assert srv.server.reconciler.wait_idle(10)
        _poison(srv, cid, {"enabled": True, "max_runtime_hours": 1, "action": None})
        r = c.post(f"/v1/clusters/{cid}/start", json={})
        assert r.status_code == 200, r.text
        assert srv.server.reconciler.wait_idle(10)
        got = c.get(f"/v1/clusters/{cid}").json()["data"]
        assert got["status"] == "running" and got["auto_terminate"]["error"].startswith("action")
        # The owner repairs it with one PUT that names the bad stored value.
        half = c.put(f"/v1/clusters/{cid}/auto-terminate", json={"max_runtime_hours": 2})
        assert half.status_code == 400 and half.json()["error"]["details"]["field"] == "action"
        assert "stored value null" in half.json()["error"]["message"]
        fixed = c.put(f"/v1/clusters/{cid}/auto-terminate", json={"action": "stop"})
        assert fixed.status_code == 200, fixed.text
        block = fixed.json()["data"]["auto_terminate"]
        assert block["error"] is None and block["next_rule"] == "max_runtime"
