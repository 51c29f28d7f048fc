"""Snapshots over real HTTP (the real app, SQLite, the in-memory engine and the real
restic repository): every route, every refusal in the v1 envelope, never a 500."""

from __future__ import annotations

import time
from typing import Any

import httpx

from tests.api.test_rest_errors import err, key_for
from tests.helpers import LiveServer
from tests.required_parts import needs_tools

pytestmark = needs_tools("restic", how="apt-get install restic")

A6000 = "NVIDIA RTX A6000"


def running(c: httpx.Client, srv: LiveServer, **extra: Any) -> str:
    r = c.post(
        "/v1/clusters",
        json={"gpu_type": A6000, "gpu_count": 1, "docker_image": "img", "volume_gb": 5, **extra},
    )
    assert r.status_code == 201, r.text
    cid: str = r.json()["data"]["id"]
    assert srv.server.reconciler.wait_idle(20)
    return cid


def ready(c: httpx.Client, sid: str) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while True:
        data: dict[str, Any] = c.get(f"/v1/snapshots/{sid}").json()["data"]
        if data["status"] != "creating":
            return data
        assert time.monotonic() < deadline, data
        time.sleep(0.05)


def test_snapshot_routes_and_restore(srv: LiveServer) -> None:
    with srv.client() as c:
        cid = running(c, srv)
        r = c.post(f"/v1/clusters/{cid}/snapshots", json={"name": "nightly", "description": "x"})
        assert r.status_code == 202, r.text
        snap = r.json()["data"]
        assert snap["status"] == "creating" and snap["consistency"] == "crash_consistent"
        assert snap["source_cluster_id"] == cid and snap["name"] == "nightly"
        done = ready(c, snap["id"])
        assert done["status"] == "ready" and done["ready_at"] and done["progress"] is None
        listed = c.get("/v1/snapshots", params={"cluster_id": cid}).json()["data"]
        assert [s["id"] for s in listed["snapshots"]] == [snap["id"]]
        assert listed["pagination"]["total"] == 1
        assert c.get("/v1/snapshots", params={"status": "failed"}).json()["data"]["snapshots"] == []

        # Restore on a running cluster: 409 INVALID_STATE, nothing changed.
        e = err(
            c.post(f"/v1/clusters/{cid}/start", json={"restore_from_snapshot": snap["id"]}),
            409,
            "INVALID_STATE",
        )
        assert e["details"]["current_status"] == "running"
        assert c.post(f"/v1/clusters/{cid}/stop").status_code == 200
        assert srv.server.reconciler.wait_idle(20)
        r = c.post(
            f"/v1/clusters/{cid}/start",
            json={"restore_from_snapshot": snap["id"], "snapshot_before_changes": True},
        )
        assert r.status_code == 200, r.text
        started = r.json()["data"]
        assert any(snap["id"] in a for a in started["configuration_updates_applied"])
        before = started["snapshot_before_changes"]
        assert before["status"] == "creating"
        assert srv.server.reconciler.wait_idle(30)
        assert c.get(f"/v1/clusters/{cid}").json()["data"]["status"] == "running"
        assert ready(c, before["id"])["consistency"] == "stopped"

        # A clone.
        r = c.post(
            "/v1/clusters",
            json={"gpu_type": A6000, "docker_image": "img", "snapshot_id": snap["id"]},
        )
        assert r.status_code == 201, r.text
        assert r.json()["data"]["volume_gb"] == 5
        # (A delete is refused while the snapshot is restored into the clone.)
        assert srv.server.reconciler.wait_idle(30)

        r = c.delete(f"/v1/snapshots/{snap['id']}")
        assert r.status_code == 200 and r.json()["data"] == {"id": snap["id"], "deleted": True}
        err(c.get(f"/v1/snapshots/{snap['id']}"), 404, "SNAPSHOT_NOT_FOUND")


def test_snapshot_errors(srv: LiveServer) -> None:
    with srv.client() as c:
        cid = running(c, srv)
        no_volume = running(c, srv, volume_gb=0)
        snap = c.post(f"/v1/clusters/{cid}/snapshots").json()["data"]
        # Deleting one still being taken.
        e = err(c.delete(f"/v1/snapshots/{snap['id']}"), 409, "INVALID_STATE")
        assert e["details"]["current_status"] == "creating"
        ready(c, snap["id"])
        err(c.post(f"/v1/clusters/{no_volume}/snapshots"), 409, "INVALID_STATE")
        err(c.post("/v1/clusters/nosuchcluster00/snapshots"), 404, "CLUSTER_NOT_FOUND")
        err(c.get("/v1/snapshots/snap_nosuch000"), 404, "SNAPSHOT_NOT_FOUND")
        err(c.delete("/v1/snapshots/snap_nosuch000"), 404, "SNAPSHOT_NOT_FOUND")
        err(
            c.post(f"/v1/clusters/{cid}/snapshots", json={"name": "x", "bogus": 1}),
            400,
            "VALIDATION_ERROR",
        )
        err(
            c.post(f"/v1/clusters/{cid}/snapshots", json={"name": "a\u202eb"}),
            400,
            "VALIDATION_ERROR",
        )
        err(c.get("/v1/snapshots", params={"status": "nope"}), 400, "VALIDATION_ERROR")
        err(
            c.post(
                "/v1/clusters",
                json={"docker_image": "img", "snapshot_id": "snap_nosuch000"},
            ),
            404,
            "SNAPSHOT_NOT_FOUND",
        )
        assert c.post(f"/v1/clusters/{cid}/stop").status_code == 200
        assert srv.server.reconciler.wait_idle(20)
        err(
            c.post(f"/v1/clusters/{cid}/start", json={"restore_from_snapshot": "snap_xyz789"}),
            404,
            "SNAPSHOT_NOT_FOUND",
        )
        assert c.get(f"/v1/clusters/{cid}").json()["data"]["status"] == "stopped"

    # Another account: every id answers 404, nothing leaks.
    other = key_for(srv, "mallory@example.com")
    with srv.client(other) as c:
        err(c.get(f"/v1/snapshots/{snap['id']}"), 404, "SNAPSHOT_NOT_FOUND")
        err(c.delete(f"/v1/snapshots/{snap['id']}"), 404, "SNAPSHOT_NOT_FOUND")
        err(c.post(f"/v1/clusters/{cid}/snapshots"), 404, "CLUSTER_NOT_FOUND")
        assert c.get("/v1/snapshots").json()["data"]["snapshots"] == []
        err(
            c.post(
                "/v1/clusters",
                json={"gpu_type": A6000, "docker_image": "img", "snapshot_id": snap["id"]},
            ),
            404,
            "SNAPSHOT_NOT_FOUND",
        )
        mine = running(c, srv)
        assert c.post(f"/v1/clusters/{mine}/stop").status_code == 200
        assert srv.server.reconciler.wait_idle(20)
        err(
            c.post(f"/v1/clusters/{mine}/start", json={"restore_from_snapshot": snap["id"]}),
            404,
            "SNAPSHOT_NOT_FOUND",
        )
    assert all(s < 500 for s in srv.recorder.statuses)
