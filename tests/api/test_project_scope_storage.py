"""Project isolation of storage over real HTTP (the real app, SQLite, the fake
runtime): a key restricted to project "two" and a member given only project "two"
neither see nor touch project "five"'s network volumes, snapshots, reserved IPs and
security groups, on every route and GraphQL field (404 like another account's ids),
cannot create in "five", cannot mount or restore from "five" into "two", and list
only their project's. A cluster mounts only a network volume of its own project."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner, Result
from sqlalchemy import select

from gpuyard.cli.main import cli
from gpuyard.core.tls_trust import trusted_tls
from gpuyard.store.schema import Account, Project, Snapshot
from gpuyard.testing.fake_runtime import FakeRuntime
from tests.api.test_accounts import invite_and_accept
from tests.helpers import LiveServer, live_server, make_settings, refused, v1_error

A6000 = "NVIDIA RTX A6000"
POOL = "203.0.113.0/29"
RULES = [{"protocol": "tcp", "port_range": "22", "source_cidr": "10.0.0.0/8"}]


@pytest.fixture
def srv(tmp_path: Path, fake_runtime: FakeRuntime) -> Iterator[LiveServer]:
    with live_server(make_settings(tmp_path / "home", reserved_ips=POOL), fake_runtime) as s:
        yield s


def ok(r: httpx.Response, status: int = 200) -> Any:
    assert r.status_code == status, r.text
    return r.json()["data"]


def add_snapshot(srv: LiveServer, snap_id: str, project_id: int, **source: str) -> str:
    """A ready snapshot row of ``project_id`` (reads and refusals need no data)."""
    with srv.server.ctx.transaction() as s:
        account_id = s.scalar(select(Project.account_id).where(Project.id == project_id))
        s.add(
            Snapshot(
                id=snap_id,
                account_id=account_id,
                project_id=project_id,
                name=snap_id,
                host_id=1,
                volume_name=f"vol-{snap_id}",
                volume_gb=5,
                status="ready",
                consistency="stopped",
                size_bytes=1024,
                stored_bytes=1024,
                file_count=1,
                created_at=datetime.now(UTC),
                ready_at=datetime.now(UTC),
                **source,
            )
        )
    return snap_id


def cluster(c: httpx.Client, srv: LiveServer, project_id: int, **extra: Any) -> str:
    body = {"gpu_type": A6000, "gpu_count": 1, "docker_image": "img", "volume_gb": 5}
    made = ok(c.post("/v1/clusters", json={**body, "project_id": project_id, **extra}), 201)
    assert srv.server.reconciler.wait_idle(20)
    cid: str = made["id"]
    return cid


@dataclass
class Five:
    """What the owner made in project "five"."""

    project: int
    volume: str
    cluster: str
    snapshot: str
    volume_snapshot: str
    ip: int
    group: int


@dataclass
class Setup:
    five: Five
    two: int
    account_id: int
    restricted_key: str
    member_key: str
    # The owner of another account, a member here given only "two" (acts here through
    # X-Gpuyard-Account).
    guest_key: str


@pytest.fixture
def setup(srv: LiveServer) -> Setup:
    with srv.client() as c:
        aid = ok(c.get("/v1/me"))["acting"]["account_id"]
        five = ok(c.post("/v1/projects", json={"name": "five"}), 201)["id"]
        two = ok(c.post("/v1/projects", json={"name": "two"}), 201)["id"]
        restricted = ok(
            c.post("/v1/api-keys", json={"name": "ci", "scope": "write", "project_id": two}),
            201,
        )["key"]
        vol = {"name": "data", "size": 10, "dataCenterId": "local", "project_id": five}
        volume = ok(c.post("/v1/networkvolumes", json=vol), 201)["id"]
        cid = cluster(c, srv, five)
        ip = ok(c.post("/v1/reserved-ips", params={"project_id": five}), 201)["id"]
        group = ok(
            c.post(
                "/v1/security-groups",
                params={"project_id": five},
                json={"name": "ssh", "rules": RULES},
            ),
            201,
        )["id"]
    member = invite_and_accept(srv, srv.key, aid, "dev@two.test", "member", project_ids=[two])
    with srv.client() as c:
        guest = c.post("/v1/accounts", json={"name": "guest", "owner_email": "guest@g.test"})
        guest_key = ok(guest, 201)["api_key"]["key"]
    invite_and_accept(srv, srv.key, aid, "guest@g.test", "member", key=guest_key, project_ids=[two])
    return Setup(
        five=Five(
            project=five,
            volume=volume,
            cluster=cid,
            snapshot=add_snapshot(srv, "snapfivecl", five, source_cluster_id=cid),
            volume_snapshot=add_snapshot(srv, "snapfivenv", five, source_network_volume_id=volume),
            ip=ip,
            group=group,
        ),
        two=two,
        account_id=aid,
        restricted_key=restricted,
        member_key=member["api_key"]["key"],
        guest_key=guest_key,
    )


def not_found(r: httpx.Response, code: str) -> None:
    v1_error(r, 404, code)


def caller(srv: LiveServer, setup: Setup, who: str) -> dict[str, str]:
    """The headers of a caller restricted to project "two"."""
    if who == "restricted key":
        return {"Authorization": f"Bearer {setup.restricted_key}"}
    if who == "project member":
        return {"Authorization": f"Bearer {setup.member_key}"}
    return {
        "Authorization": f"Bearer {setup.guest_key}",
        "X-Gpuyard-Account": str(setup.account_id),
    }


def graphql(srv: LiveServer, headers: dict[str, str], query: str) -> dict[str, Any]:
    r = httpx.post(
        f"{srv.url}/graphql",
        json={"query": query},
        headers=headers,
        timeout=60,
        verify=trusted_tls(),
    )
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


@pytest.mark.parametrize("who", ["restricted key", "project member", "member of another account"])
def test_another_projects_storage_is_not_found(srv: LiveServer, setup: Setup, who: str) -> None:
    headers = caller(srv, setup, who)
    five, two = setup.five, setup.two
    with httpx.Client(base_url=srv.url, headers=headers, timeout=60, verify=trusted_tls()) as c:
        assert ok(c.get("/v1/me"))["acting"]["project_ids"] == [two]
        # What the caller may make in its own project, to aim at "five"'s from.
        vol = {"name": "mine", "size": 5, "dataCenterId": "local"}
        own_volume = ok(c.post("/v1/networkvolumes", json={**vol, "project_id": two}), 201)["id"]
        own_cluster = cluster(c, srv, two)
        assert ok(c.post(f"/v1/clusters/{own_cluster}/stop"))["id"] == own_cluster
        assert srv.server.reconciler.wait_idle(20)
        own_snapshot = add_snapshot(srv, f"snaptwo{who[:3]}", two, source_cluster_id=own_cluster)

        # Network volumes: read, grow, rename, delete, snapshot, restore, quote, mount.
        nv = "NETWORK_VOLUME_NOT_FOUND"
        not_found(c.get(f"/v1/networkvolumes/{five.volume}"), nv)
        not_found(c.patch(f"/v1/networkvolumes/{five.volume}", json={"size": 20}), nv)
        not_found(c.patch(f"/v1/networkvolumes/{five.volume}", json={"name": "x"}), nv)
        not_found(c.delete(f"/v1/networkvolumes/{five.volume}"), nv)
        not_found(c.post(f"/v1/networkvolumes/{five.volume}/snapshots", json={}), nv)
        not_found(
            c.post(f"/v1/networkvolumes/{five.volume}/restore", json={"snapshot_id": own_snapshot}),
            nv,
        )
        quote = {"gpu_type": A6000, "network_volume_id": five.volume}
        not_found(c.post("/v1/prices/quote", json=quote), nv)
        body = {"gpu_type": A6000, "docker_image": "img", "network_volume_id": five.volume}
        not_found(c.post("/v1/clusters", json=body), nv)
        not_found(c.post("/v1/clusters", json={**body, "project_id": two}), nv)
        listed = ok(c.get("/v1/networkvolumes"))["network_volumes"]
        assert [v["id"] for v in listed] == [own_volume]
        # Nor made in "five".
        not_found(
            c.post("/v1/networkvolumes", json={**vol, "project_id": five.project}), "NOT_FOUND"
        )

        # Snapshots: read, delete, list, clone, restore (v1 and v2 starts, network volume).
        sn = "SNAPSHOT_NOT_FOUND"
        for snap in (five.snapshot, five.volume_snapshot):
            not_found(c.get(f"/v1/snapshots/{snap}"), sn)
            not_found(c.delete(f"/v1/snapshots/{snap}"), sn)
            not_found(
                c.post(
                    "/v1/clusters",
                    json={"gpu_type": A6000, "docker_image": "img", "snapshot_id": snap},
                ),
                sn,
            )
            not_found(
                c.post(f"/v1/clusters/{own_cluster}/start", json={"restore_from_snapshot": snap}),
                sn,
            )
            not_found(
                c.post(f"/v2/clusters/{own_cluster}/start", json={"restore_from_snapshot": snap}),
                sn,
            )
            not_found(
                c.post(f"/v1/networkvolumes/{own_volume}/restore", json={"snapshot_id": snap}), sn
            )
        listed = ok(c.get("/v1/snapshots"))["snapshots"]
        assert [s["id"] for s in listed] == [own_snapshot]
        for params in (
            {"project_id": five.project},
            {"cluster_id": five.cluster},
            {"network_volume_id": five.volume},
        ):
            assert ok(c.get("/v1/snapshots", params=params))["snapshots"] == []
        not_found(c.post(f"/v1/clusters/{five.cluster}/snapshots", json={}), "CLUSTER_NOT_FOUND")

        # Reserved IPs and security groups by id, with and without a project named.
        for params in ({}, {"project_id": two}):
            rip = "RESERVED_IP_NOT_FOUND"
            not_found(c.get(f"/v1/reserved-ips/{five.ip}", params=params), rip)
            not_found(c.delete(f"/v1/reserved-ips/{five.ip}", params=params), rip)
            sg = "SECURITY_GROUP_NOT_FOUND"
            not_found(c.get(f"/v1/security-groups/{five.group}", params=params), sg)
            not_found(c.delete(f"/v1/security-groups/{five.group}", params=params), sg)
            put = c.put(
                f"/v1/security-groups/{five.group}",
                params=params,
                json={"name": "x", "rules": RULES},
            )
            not_found(put, sg)
        assert ok(c.get("/v1/reserved-ips"))["reserved_ips"] == []
        pnf = "PROJECT_NOT_FOUND"
        not_found(c.get("/v1/reserved-ips", params={"project_id": five.project}), pnf)
        not_found(c.post("/v1/reserved-ips", params={"project_id": five.project}), pnf)

    # GraphQL: the list, and a deploy mounting "five"'s volume.
    listed_gql = graphql(srv, headers, "{ myself { networkVolumes { id } } }")
    assert listed_gql["data"]["myself"]["networkVolumes"] == [{"id": own_volume}]
    deployed = graphql(
        srv,
        headers,
        'mutation { podFindAndDeployOnDemand(input: { gpuTypeId: "NVIDIA RTX A6000", '
        f'imageName: "img", networkVolumeId: "{five.volume}" }}) {{ id }} }}',
    )
    assert [e["extensions"]["code"] for e in deployed["errors"]] == [nv]

    # Nothing of "five" changed; the owner still sees all of it.
    with srv.client() as c:
        assert ok(c.get(f"/v1/networkvolumes/{five.volume}"))["size"] == 10
        assert ok(c.get(f"/v1/networkvolumes/{five.volume}"))["name"] == "data"
        assert ok(c.get(f"/v1/snapshots/{five.snapshot}"))["status"] == "ready"
        assert ok(c.get(f"/v1/reserved-ips/{five.ip}"))["id"] == five.ip
        assert ok(c.get(f"/v1/security-groups/{five.group}"))["id"] == five.group
        every = {s["id"] for s in ok(c.get("/v1/snapshots"))["snapshots"]}
        assert {five.snapshot, five.volume_snapshot, own_snapshot} <= every


def test_a_cluster_mounts_only_a_volume_of_its_own_project(srv: LiveServer, setup: Setup) -> None:
    five, two = setup.five, setup.two
    body = {"gpu_type": A6000, "docker_image": "img", "network_volume_id": five.volume}
    with srv.client() as c:  # the owner may use both projects
        e = refused(c.post("/v1/clusters", json={**body, "project_id": two}), "network_volume_id")
        assert e["details"]["network_volume_project_id"] == five.project
        # Named, its own project mounts it; unnamed, the cluster lands in the volume's.
        made = ok(c.post("/v1/clusters", json={**body, "project_id": five.project}), 201)
        assert made["volume"]["network_volume_id"] == five.volume
        assert made["project_id"] == five.project
        made = ok(c.post("/v1/clusters", json=body), 201)
        assert made["project_id"] == five.project
    # GraphQL deploys name no project: they land in the volume's too.
    deployed = srv.graphql(
        'mutation { podFindAndDeployOnDemand(input: { gpuTypeId: "NVIDIA RTX A6000", '
        f'imageName: "img", networkVolumeId: "{five.volume}" }}) {{ id }} }}'
    )
    assert "errors" not in deployed, deployed
    pod = deployed["data"]["podFindAndDeployOnDemand"]["id"]
    with srv.client() as c:
        assert ok(c.get(f"/v1/clusters/{pod}"))["project_id"] == five.project


def test_a_spent_balance_refuses_billed_storage_growth_and_new_addresses(srv: LiveServer) -> None:
    with srv.client() as c:
        vol = {"name": "data", "size": 10, "dataCenterId": "local"}
        volume = ok(c.post("/v1/networkvolumes", json=vol), 201)["id"]
        made = ok(
            c.post("/v1/clusters", json={"gpu_type": A6000, "docker_image": "img", "volume_gb": 5}),
            201,
        )
        cid = made["id"]
        assert srv.server.reconciler.wait_idle(20)
        assert ok(c.post(f"/v1/clusters/{cid}/stop"))["id"] == cid
        assert srv.server.reconciler.wait_idle(20)
        account_id = ok(c.get("/v1/me"))["acting"]["account_id"]
        # Prepaid, and the balance is spent (as the budget watch records it).
        with srv.server.ctx.transaction() as s:
            account = s.get(Account, account_id)
            assert account is not None
            account.billing_mode = "prepaid"
            account.exhausted_at = datetime.now(UTC)
        spent = "BUDGET_EXHAUSTED"
        v1_error(c.patch(f"/v1/networkvolumes/{volume}", json={"size": 20}), 402, spent)
        v1_error(c.post("/v1/reserved-ips"), 402, spent)
        v1_error(c.post("/v1/networkvolumes", json=vol), 402, spent)
        grow = {"update_configuration": {"storage_gb": 50}}
        v1_error(c.post(f"/v1/clusters/{cid}/start", json=grow), 402, spent)
        # Nothing changed; a rename (no storage) still works.
        assert ok(c.get(f"/v1/networkvolumes/{volume}"))["size"] == 10
        assert ok(c.get("/v1/reserved-ips"))["reserved_ips"] == []
        assert ok(c.get(f"/v1/clusters/{cid}"))["volume_gb"] == 5
        renamed = ok(c.patch(f"/v1/networkvolumes/{volume}", json={"name": "renamed"}))
        assert renamed["name"] == "renamed" and renamed["size"] == 10
        # A suspended account is refused the same growth with 403.
        with srv.server.ctx.transaction() as s:
            account = s.get(Account, account_id)
            assert account is not None
            account.exhausted_at = None
            account.status = "suspended"
        suspended = "ACCOUNT_SUSPENDED"
        v1_error(c.patch(f"/v1/networkvolumes/{volume}", json={"size": 20}), 403, suspended)
        v1_error(c.post("/v1/reserved-ips"), 403, suspended)


def test_a_restricted_key_reads_no_bill(srv: LiveServer, setup: Setup) -> None:
    """The bill is the account's (credits, balance, every project's lines): a key
    restricted to a project is refused it, whichever project it names."""
    with srv.client(setup.restricted_key) as c:
        for params in ({}, {"project_id": setup.five.project}, {"project_id": setup.two}):
            r = c.get("/v1/billing", params=params)
            assert r.status_code == 403, r.text
            assert r.json()["error"]["details"]["restricted_to_project"] == setup.two


def test_the_cli_of_a_restricted_key_sees_only_its_project(srv: LiveServer, setup: Setup) -> None:
    five = setup.five
    env = {
        "GPUYARD_URL": srv.url,
        "GPUYARD_API_KEY": setup.restricted_key,
        "GPUYARD_HOME": str(srv.server.ctx.settings.home),
    }

    def run(*args: str) -> Result:
        return CliRunner().invoke(cli, list(args), env=env)

    listed = run("snapshots", "list", "--json")
    assert listed.exit_code == 0, listed.output
    assert json.loads(listed.stdout)["snapshots"] == []
    for args, code in (
        (("snapshots", "get", five.snapshot), "SNAPSHOT_NOT_FOUND"),
        (("snapshots", "delete", five.volume_snapshot), "SNAPSHOT_NOT_FOUND"),
        (("snapshots", "list", "--project", str(five.project)), None),
        (("reserved-ips", "release", str(five.ip)), "RESERVED_IP_NOT_FOUND"),
        (("reserved-ips", "list", "--project-id", str(five.project)), "PROJECT_NOT_FOUND"),
    ):
        result = run(*args)
        if code is None:
            assert result.exit_code == 0 and five.snapshot not in result.output, result.output
        else:
            assert result.exit_code == 1 and code in result.stderr, (args, result.output)
    with srv.client() as c:
        assert ok(c.get(f"/v1/snapshots/{five.volume_snapshot}"))["status"] == "ready"
        assert ok(c.get(f"/v1/reserved-ips/{five.ip}"))["id"] == five.ip
