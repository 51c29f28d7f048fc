"""A serverless endpoint's worker clusters over real HTTP: the running server's scaler
starts one for a queued job; it is absent from every list the user has (REST v1,
RunPod v2 pods, GraphQL pods), readable by id with its endpoint named, refused to the
user's actions (409 on v1 and v2), billed under the endpoint's name and counted in the account's
currentSpendPerHr; another account
can neither see nor touch it (404)."""

from __future__ import annotations

import time
from collections.abc import Callable

from sqlalchemy import select

from gpuyard.core.ids import new_endpoint_id, new_job_id
from gpuyard.services.tenancy.auth import resolve_key
from gpuyard.store.schema import ServerlessEndpoint, ServerlessJob, ServerlessWorker
from tests.helpers import LiveServer, account_with_members, v1_error

A = "NVIDIA RTX A6000"


def wait_for(check: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_worker_clusters_are_the_endpoints_not_the_users(srv: LiveServer) -> None:
    ctx = srv.server.ctx
    now = ctx.clock.now()
    with ctx.read() as session:
        me = resolve_key(session, srv.key)
    eid = new_endpoint_id()
    with ctx.transaction() as session:
        session.add(
            ServerlessEndpoint(
                id=eid,
                account_id=me.account_id,
                project_id=me.default_project_id,
                name="echo",
                image="img",
                gpu_type_ids=[A],
                gpu_count=1,
                scaler_type="REQUEST_COUNT",
                scaler_value=1,
                created_at=now,
                updated_at=now,
            )
        )
        session.add(
            ServerlessJob(
                id=new_job_id(),
                endpoint_id=eid,
                account_id=me.account_id,
                input_json="{}",
                queued_at=now,
                created_at=now,
                updated_at=now,
            )
        )
    ctx.wake()

    def worker_cluster() -> str | None:
        with ctx.read() as session:
            return session.scalar(
                select(ServerlessWorker.cluster_id).where(ServerlessWorker.endpoint_id == eid)
            )

    wait_for(lambda: worker_cluster() is not None)
    cid = worker_cluster()
    assert cid is not None
    c = srv.client()
    wait_for(lambda: c.get(f"/v1/clusters/{cid}").json()["data"]["status"] == "running")

    one = c.get(f"/v1/clusters/{cid}").json()["data"]
    assert one["serverless_endpoint_id"] == eid and one["actions"] == []
    assert one["name"] == "echo-worker-1"
    assert cid not in [x["id"] for x in c.get("/v1/clusters").json()["data"]["clusters"]]
    assert cid not in [p["id"] for p in c.get("/runpod/v2/pods").json()["pods"]]
    me_gql = srv.graphql("query { myself { pods { id } currentSpendPerHr } }")["data"]["myself"]
    assert cid not in [p["id"] for p in me_gql["pods"]]
    # Not listed, but spent: the account's spend counts its workers.
    assert me_gql["currentSpendPerHr"] == one["cost"]["hourly_rate"] > 0

    for r in (
        c.post(f"/v1/clusters/{cid}/stop"),
        c.post(f"/v1/clusters/{cid}/restart"),
        c.post(f"/v1/clusters/{cid}/start", json={}),
        c.delete(f"/v1/clusters/{cid}"),
    ):
        err = v1_error(r, 409, "SERVERLESS_WORKER")
        assert f"worker of endpoint {eid}" in err["message"]
    for r in (
        c.post(f"/runpod/v2/pods/{cid}/action", json={"action": "stop"}),
        c.delete(f"/runpod/v2/pods/{cid}"),
    ):
        assert r.status_code == 409, r.text
        assert r.headers["content-type"].startswith("application/problem+json")
        assert eid in r.json()["detail"]
    assert c.get(f"/v1/clusters/{cid}").json()["data"]["status"] == "running"

    # Billing counts whole seconds: the first line shows once a second has passed.
    def billed() -> list[tuple[str, str]]:
        items = c.get("/v1/billing").json()["data"]["items"]
        return [(i["key"], i["name"]) for i in items]

    wait_for(lambda: billed() != [])
    assert billed() == [(eid, "echo")]

    # Another account: the worker cluster is not there, whatever it asks.
    _, _, keys = account_with_members(srv, "mallory@example.com", ())
    m = srv.client(keys["owner"])
    v1_error(m.get(f"/v1/clusters/{cid}"), 404)
    v1_error(m.post(f"/v1/clusters/{cid}/stop"), 404)
    v1_error(m.delete(f"/v1/clusters/{cid}"), 404)
    assert m.post(f"/runpod/v2/pods/{cid}/action", json={"action": "stop"}).status_code == 404
    assert m.get("/v1/clusters").json()["data"]["clusters"] == []
    assert m.get("/v1/billing").json()["data"]["items"] == []
    assert c.get(f"/v1/clusters/{cid}").json()["data"]["status"] == "running"
