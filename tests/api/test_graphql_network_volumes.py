"""GraphQL and network volumes: ``networkVolumeId`` on every deploy mutation mounts the
volume at ``volumeMountPath`` on its host; ``myself { networkVolumes }`` lists them."""

from __future__ import annotations

from typing import Any

import pytest

from gpuyard.services.tenancy.auth import Scope, create_account, issue_key
from tests.helpers import LiveServer, add_host_row

DEPLOYS = {
    "podFindAndDeployOnDemand": "",
    "clusterFindAndDeployOnDemand": "",
    "podRentInterruptable": "bidPerGpu: 0.5, ",
    "clusterRentInterruptable": "bidPerGpu: 0.5, ",
    "deployCpuPod": "",
}


def codes(body: dict[str, Any]) -> list[str]:
    return [e["extensions"]["code"] for e in body.get("errors", [])]


def volume(srv: LiveServer, key: str | None = None, name: str = "data", size: int = 10) -> str:
    with srv.client(key) as c:
        r = c.post("/v1/networkvolumes", json={"name": name, "size": size, "dataCenterId": "local"})
        assert r.status_code == 201, r.text
        vid: str = r.json()["data"]["id"]
        return vid


def deploy(srv: LiveServer, mutation: str, extra: str, key: str | None = None) -> dict[str, Any]:
    query = (
        f"mutation {{ {mutation}(input: {{ {DEPLOYS[mutation]}gpuTypeId: "
        f'"NVIDIA RTX A6000", imageName: "img", volumeInGb: 40, {extra} }}) '
        "{ id volumeInGb volumeMountPath machineId networkVolume { id name size dataCenterId } } }"
    )
    return srv.graphql(query, key=key)


@pytest.mark.parametrize("mutation", sorted(DEPLOYS))
def test_every_deploy_mounts_the_network_volume(srv: LiveServer, mutation: str) -> None:
    vid = volume(srv)
    body = deploy(srv, mutation, f'networkVolumeId: "{vid}", volumeMountPath: "/vol"')
    assert "errors" not in body, body
    pod = body["data"][mutation]
    assert pod["volumeMountPath"] == "/vol" and pod["volumeInGb"] == 0
    assert pod["networkVolume"] == {"id": vid, "name": "data", "size": 10, "dataCenterId": "local"}
    assert srv.server.reconciler.wait_idle(10)
    with srv.client() as c:
        rest = c.get(f"/v1/clusters/{pod['id']}").json()["data"]
        assert rest["volume"]["network_volume_id"] == vid and rest["status"] == "running"
        assert str(rest["host"]["id"]) == pod["machineId"]
        got = c.get(f"/v1/networkvolumes/{vid}").json()["data"]
        assert got["attached_cluster_ids"] == [pod["id"]]


def test_myself_lists_the_accounts_network_volumes(srv: LiveServer) -> None:
    first, second = volume(srv, name="a"), volume(srv, name="b", size=20)
    with srv.server.ctx.transaction() as session:
        user, account, _ = create_account(session, email="b@example.com", name="b")
        other = issue_key(
            session, user_id=user.id, account_id=account.id, name="b", scope=Scope.WRITE
        ).key
    volume(srv, other, name="theirs")
    query = "{ myself { networkVolumes { id name size dataCenterId } } }"
    mine = srv.graphql(query)["data"]["myself"]["networkVolumes"]
    assert {v["id"] for v in mine} == {first, second}
    assert {(v["name"], v["size"], v["dataCenterId"]) for v in mine} == {
        ("a", 10, "local"),
        ("b", 20, "local"),
    }
    theirs = srv.graphql(query, key=other)["data"]["myself"]["networkVolumes"]
    assert [v["name"] for v in theirs] == ["theirs"]
    # Their volume is not ours to mount.
    body = deploy(srv, "podFindAndDeployOnDemand", f'networkVolumeId: "{theirs[0]["id"]}"')
    assert codes(body) == ["NETWORK_VOLUME_NOT_FOUND"]
    # A pod of its own volume shows none.
    body = deploy(srv, "podFindAndDeployOnDemand", "")
    pod = body["data"]["podFindAndDeployOnDemand"]
    assert pod["networkVolume"] is None and pod["volumeInGb"] == 40


def test_unknown_volume_and_another_data_centre_are_refused(srv: LiveServer) -> None:
    body = deploy(srv, "podFindAndDeployOnDemand", 'networkVolumeId: "nosuchvol1"')
    assert codes(body) == ["NETWORK_VOLUME_NOT_FOUND"]
    assert body["errors"][0]["extensions"]["details"] == {"network_volume_id": "nosuchvol1"}
    vid = volume(srv)
    add_host_row(srv.server.ctx, "eu1", location="eu-west")
    body = deploy(
        srv, "podFindAndDeployOnDemand", f'networkVolumeId: "{vid}", dataCenterId: "eu-west"'
    )
    assert codes(body) == ["VALIDATION_ERROR"]
    assert body["errors"][0]["extensions"]["details"]["field"] == "input.dataCenterId"
    body = deploy(
        srv, "podFindAndDeployOnDemand", f'networkVolumeId: "{vid}", dataCenterId: "local"'
    )
    assert "errors" not in body, body
    with srv.client() as c:
        assert len(c.get("/v1/clusters").json()["data"]["clusters"]) == 1
