"""``/v1/networkvolumes`` over real HTTP: the RunPod body and answer, every error
(foreign ids, attached volumes, shrinking, unknown data centres, scopes), clusters
mounting a volume and the ``volume`` object of the cluster view."""

from __future__ import annotations

import time
from typing import Any

from gpuyard.api.rest import network_volumes as api
from gpuyard.api.rest.schemas import responses as schemas
from gpuyard.services.tenancy.auth import Scope, create_account, issue_key, resolve_key
from gpuyard.testing.fake_runtime import FakeRuntime
from tests.helpers import LiveServer, refused, v1_error

BODY = {"name": "data", "size": 10, "dataCenterId": "local"}


def other_key(srv: LiveServer, email: str = "b@example.com", scope: Scope = Scope.WRITE) -> str:
    with srv.server.ctx.transaction() as session:
        user, account, _ = create_account(session, email=email, name="b")
        return issue_key(session, user_id=user.id, account_id=account.id, name="k", scope=scope).key


def read_key(srv: LiveServer) -> str:
    """A read-only key of the admin's own account."""
    with srv.server.ctx.read() as session:
        admin = resolve_key(session, srv.key)
    with srv.server.ctx.transaction() as session:
        return issue_key(
            session, user_id=admin.user_id, account_id=admin.account_id, name="ro", scope=Scope.READ
        ).key


def cluster_body(volume_id: str, **kw: object) -> dict[str, Any]:
    return {
        "gpu_type": "NVIDIA RTX A6000",
        "docker_image": "img",
        "network_volume_id": volume_id,
        **kw,
    }


def test_create_list_get_grow_mount_and_delete(srv: LiveServer) -> None:
    with srv.client() as c:
        r = c.post("/v1/networkvolumes", json=BODY)
        assert r.status_code == 201, r.text
        api.NetworkVolumeEnvelope.model_validate(r.json())
        created = r.json()["data"]
        vid = created["id"]
        assert {k: created[k] for k in ("name", "size", "dataCenterId")} == {
            "name": "data",
            "size": 10,
            "dataCenterId": "local",
        }
        assert created["attached_cluster_ids"] == [] and created["used_bytes"] is None

        listed = c.get("/v1/networkvolumes").json()
        api.NetworkVolumeListEnvelope.model_validate(listed)
        assert [v["id"] for v in listed["data"]["network_volumes"]] == [vid]

        grown = c.patch(f"/v1/networkvolumes/{vid}", json={"size": 20, "name": "big"})
        assert grown.status_code == 200, grown.text
        api.NetworkVolumeEnvelope.model_validate(grown.json())
        assert (grown.json()["data"]["size"], grown.json()["data"]["name"]) == (20, "big")
        shrink = refused(c.patch(f"/v1/networkvolumes/{vid}", json={"size": 19}), "size")
        assert shrink["details"]["current_size"] == 20

        r = c.post("/v1/clusters", json=cluster_body(vid, volume_gb=50, volume_mount_path="/nv"))
        assert r.status_code == 201, r.text
        schemas.ClusterEnvelope.model_validate(r.json())
        cid = r.json()["data"]["id"]
        assert r.json()["data"]["volume_gb"] == 0  # none of its own
        volume = r.json()["data"]["volume"]
        # The reconciler may measure the new volume before this answer is made: then
        # both of its measurement's fields are set, else neither.
        measured = {k: volume.pop(k) for k in ("used_bytes", "measured_at")}
        assert (measured["used_bytes"] is None) == (measured["measured_at"] is None), measured
        assert volume == {"size_gb": 20, "mount_path": "/nv", "network_volume_id": vid}
        assert srv.server.reconciler.wait_idle(10)
        got = c.get(f"/v1/networkvolumes/{vid}").json()
        api.NetworkVolumeEnvelope.model_validate(got)
        assert got["data"]["attached_cluster_ids"] == [cid]

        in_use = v1_error(c.delete(f"/v1/networkvolumes/{vid}"), 409, "NETWORK_VOLUME_IN_USE")
        assert in_use["details"] == {"cluster_ids": [cid], "snapshot_ids": []}
        assert cid in in_use["message"]

        assert c.delete(f"/v1/clusters/{cid}").status_code == 200
        assert srv.server.reconciler.wait_idle(10)
        r = c.delete(f"/v1/networkvolumes/{vid}")
        assert r.status_code == 200, r.text
        api.NetworkVolumeDeletedEnvelope.model_validate(r.json())
        assert r.json()["data"] == {"id": vid, "deleted": True}
        v1_error(c.get(f"/v1/networkvolumes/{vid}"), 404, "NETWORK_VOLUME_NOT_FOUND")
        v1_error(c.delete(f"/v1/networkvolumes/{vid}"), 404, "NETWORK_VOLUME_NOT_FOUND")
        assert c.get("/v1/networkvolumes").json()["data"]["network_volumes"] == []


def test_bad_bodies_are_400s(srv: LiveServer) -> None:
    with srv.client() as c:
        unknown = refused(
            c.post("/v1/networkvolumes", json={**BODY, "dataCenterId": "mars"}), "dataCenterId"
        )
        assert unknown["details"]["locations"] == ["local"]
        refused(c.post("/v1/networkvolumes", json={**BODY, "size": 0}), "size")
        refused(c.post("/v1/networkvolumes", json={**BODY, "size": 65537}), "size")
        refused(c.post("/v1/networkvolumes", json={**BODY, "size": "10"}), "size")
        refused(c.post("/v1/networkvolumes", json={**BODY, "name": ""}), "name")
        refused(c.post("/v1/networkvolumes", json={**BODY, "nope": 1}), "nope")
        r = c.post("/v1/networkvolumes", json={"name": "x", "size": 10})
        assert r.status_code == 400 and "dataCenterId" in r.text
        r = c.post("/v1/networkvolumes", json={**BODY, "size": 10.0})
        assert r.status_code == 201, r.text  # a whole float is an integer
        full = c.post("/v1/networkvolumes", json={**BODY, "size": 65536})
        v1_error(full, 409, "INSUFFICIENT_CAPACITY")
        assert len(c.get("/v1/networkvolumes").json()["data"]["network_volumes"]) == 1


def test_another_accounts_volume_is_not_found(srv: LiveServer, fake_runtime: FakeRuntime) -> None:
    theirs = other_key(srv)
    with srv.client(theirs) as c:
        vid = c.post("/v1/networkvolumes", json=BODY).json()["data"]["id"]
    with srv.client() as c:
        for r in (
            c.get(f"/v1/networkvolumes/{vid}"),
            c.patch(f"/v1/networkvolumes/{vid}", json={"size": 30}),
            c.delete(f"/v1/networkvolumes/{vid}"),
            c.post("/v1/clusters", json=cluster_body(vid)),
            c.post("/v1/clusters", json=cluster_body("nosuchvol1")),
        ):
            found = v1_error(r, 404, "NETWORK_VOLUME_NOT_FOUND")
            assert found["details"]["network_volume_id"] in (vid, "nosuchvol1")
        assert c.get("/v1/networkvolumes").json()["data"]["network_volumes"] == []
        assert c.get("/v1/clusters").json()["data"]["clusters"] == []
    with srv.client(theirs) as c:
        assert c.get(f"/v1/networkvolumes/{vid}").json()["data"]["size"] == 10


def test_writes_need_a_write_key(srv: LiveServer) -> None:
    with srv.client() as c:
        vid = c.post("/v1/networkvolumes", json=BODY).json()["data"]["id"]
    with srv.client(read_key(srv)) as c:
        assert c.get(f"/v1/networkvolumes/{vid}").status_code == 200
        v1_error(c.post("/v1/networkvolumes", json=BODY), 403, "FORBIDDEN")
        v1_error(c.patch(f"/v1/networkvolumes/{vid}", json={"size": 30}), 403, "FORBIDDEN")
        v1_error(c.delete(f"/v1/networkvolumes/{vid}"), 403, "FORBIDDEN")


def test_cluster_view_shows_its_volume_and_measured_usage(
    srv: LiveServer, fake_runtime: FakeRuntime
) -> None:
    with srv.client() as c:
        vid = c.post("/v1/networkvolumes", json=BODY).json()["data"]["id"]
        mounts = c.post("/v1/clusters", json=cluster_body(vid)).json()["data"]["id"]
        own = c.post("/v1/clusters", json={"docker_image": "img", "volume_gb": 5}).json()
        own_id = own["data"]["id"]
        assert own["data"]["volume"] == {
            "size_gb": 5,
            "mount_path": "/workspace",
            "used_bytes": None,
            "measured_at": None,
            "network_volume_id": None,
        }
        bare = c.post("/v1/clusters", json={"docker_image": "img"}).json()["data"]
        assert bare["volume"] is None
        assert srv.server.reconciler.wait_idle(10)
        fake_runtime.write_file(mounts, "/workspace/f", "x" * 7)
        fake_runtime.write_file(own_id, "/workspace/f", "x" * 3)
        srv.server.reconciler.volume_usage.run(fake_runtime, ())
        for cid, used in ((mounts, 7), (own_id, 3)):
            body = c.get(f"/v1/clusters/{cid}").json()  # the polled fast path
            schemas.ClusterEnvelope.model_validate(body)
            assert body["data"]["volume"]["used_bytes"] == used
            assert body["data"]["volume"]["measured_at"] is not None
        listed = c.get("/v1/clusters").json()
        schemas.ClusterListEnvelope.model_validate(listed)
        volumes = {x["id"]: x["volume"] for x in listed["data"]["clusters"]}
        assert volumes[mounts]["network_volume_id"] == vid and volumes[mounts]["size_gb"] == 10
        assert c.get(f"/v1/networkvolumes/{vid}").json()["data"]["used_bytes"] == 7


def test_billing_names_the_volume(srv: LiveServer) -> None:
    with srv.client() as c:
        vid = c.post("/v1/networkvolumes", json=BODY).json()["data"]["id"]
        time.sleep(1.1)  # billed per whole second
        bill = c.get("/v1/billing", params={"group_by": "cluster"})
        assert bill.status_code == 200, bill.text
        schemas.BillingEnvelope.model_validate(bill.json())
        items = {i["key"]: i for i in bill.json()["data"]["items"]}
        # (A second of 10 GB is less than a micro-dollar: the amounts are the service
        # tests'; here the line and its name.)
        assert items[vid]["name"] == "data"
        assert set(items[vid]["breakdown"]) >= {"network_volume"}
