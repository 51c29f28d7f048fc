"""Acting for another account (issue 15): ``X-Gpuyard-Account`` and ``?active_iam=``
switch a user's key to an account they are a member of (REST, GraphQL, the training
API's scope), and only there; a key restricted to its account cannot switch; a key
restricted to a project sees and acts only in that project; the proxy's key check acts
for the cluster's account. Accounts and members are made through the API (the
operator's create, invitations accepted)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from gpuyard.core.tls_trust import trusted_tls
from tests.helpers import LiveServer

A6000 = "NVIDIA RTX A6000"
CLUSTER = {"gpu_type": A6000, "docker_image": "img"}
WEB = {**CLUSTER, "ports": [{"internal_port": 8888, "protocol": "http"}]}
HEADER = "X-Gpuyard-Account"


def data(r: httpx.Response, status: int = 200) -> Any:
    assert r.status_code == status, r.text
    return r.json()["data"]


def refused(r: httpx.Response, status: int = 403, code: str = "FORBIDDEN") -> None:
    assert r.status_code == status, r.text
    assert r.json()["error"]["code"] == code, r.text


@dataclass
class Account:
    id: int
    project_id: int
    owner_key: str


@dataclass
class Setup:
    a: Account
    b: Account
    c: Account
    u_key: str  # u: member in A (its home), viewer in B
    u_in_a: int  # u's memberships (active_iam values)
    u_in_b: int
    v_key: str  # v: viewer in A (its home), member in B
    a_cluster: str
    b_cluster: str


def new_account(op: httpx.Client, name: str) -> Account:
    body = {"name": name, "owner_email": f"owner@{name}.test"}
    d = data(op.post("/v1/accounts", json=body), 201)
    return Account(d["account"]["id"], d["project"]["id"], d["api_key"]["key"])


def invite(
    srv: LiveServer, account: Account, email: str, role: str, key: str | None = None
) -> tuple[int, str | None]:
    """``email`` made a member of ``account`` with ``role`` through an invitation:
    the membership id and, for a new user, their first key."""
    with srv.client(account.owner_key) as c:
        path = f"/v1/accounts/{account.id}/invitations"
        token = data(c.post(path, json={"email": email, "role": role}), 201)["token"]
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    r = httpx.post(
        f"{srv.url}/v1/invitations/{token}/accept", headers=headers, json={}, verify=trusted_tls()
    )
    d = data(r, 201 if r.status_code == 201 else 200)
    issued = d.get("api_key")
    return d["membership"]["id"], issued["key"] if issued else None


def cluster(srv: LiveServer, key: str, body: dict[str, Any]) -> str:
    with srv.client(key) as c:
        cid: str = data(c.post("/v1/clusters", json=body), 201)["id"]
    assert srv.server.reconciler.wait_idle(10)
    return cid


@pytest.fixture
def setup(srv: LiveServer) -> Setup:
    with srv.client() as op:
        a, b, c = new_account(op, "a"), new_account(op, "b"), new_account(op, "c")
    u_in_a, u_key = invite(srv, a, "u@x.test", "member")
    assert u_key is not None
    u_in_b, none = invite(srv, b, "u@x.test", "viewer", key=u_key)
    assert none is None  # an existing user gets no second key
    _, v_key = invite(srv, a, "v@x.test", "viewer")
    assert v_key is not None
    invite(srv, b, "v@x.test", "member", key=v_key)
    return Setup(
        a,
        b,
        c,
        u_key,
        u_in_a,
        u_in_b,
        v_key,
        cluster(srv, a.owner_key, WEB),
        cluster(srv, b.owner_key, WEB),
    )


def ids(r: httpx.Response) -> set[str]:
    return {c["id"] for c in data(r)["clusters"]}


def test_a_member_of_two_accounts_acts_for_either(srv: LiveServer, setup: Setup) -> None:
    s = setup
    with srv.client(s.u_key) as u:
        # The key's own account by default.
        assert ids(u.get("/v1/clusters")) == {s.a_cluster}
        data(u.get(f"/v1/clusters/{s.a_cluster}"))
        refused(u.get(f"/v1/clusters/{s.b_cluster}"), 404, "CLUSTER_NOT_FOUND")
        # B, by the header and by active_iam.
        on_b = {HEADER: str(s.b.id)}
        assert ids(u.get("/v1/clusters", headers=on_b)) == {s.b_cluster}
        assert ids(u.get("/v1/clusters", params={"active_iam": s.u_in_b})) == {s.b_cluster}
        data(u.get(f"/v1/clusters/{s.b_cluster}", headers=on_b))
        data(u.get(f"/v1/clusters/{s.b_cluster}", params={"active_iam": s.u_in_b}))
        refused(u.get(f"/v1/clusters/{s.a_cluster}", headers=on_b), 404, "CLUSTER_NOT_FOUND")
        me = data(u.get("/v1/me", headers=on_b))
        assert (me["acting"]["account_id"], me["acting"]["role"]) == (s.b.id, "viewer")
        # The role is the one held in the account acted for: a viewer in B.
        refused(u.post("/v1/clusters", json=CLUSTER, headers=on_b))
        refused(u.post(f"/v1/clusters/{s.b_cluster}/stop", headers=on_b))
        refused(u.post("/v1/clusters", json=CLUSTER, params={"active_iam": s.u_in_b}))
        # ... a member in A, its own.
        created = data(u.post("/v1/clusters", json=CLUSTER, params={"active_iam": s.u_in_a}), 201)
        assert created["project_id"] == s.a.project_id


def test_switching_needs_a_membership(srv: LiveServer, setup: Setup) -> None:
    s = setup
    with srv.client(s.u_key) as u:
        # C: an account u is no member of.
        refused(u.get("/v1/clusters", headers={HEADER: str(s.c.id)}))
        refused(u.get("/v1/clusters", headers={HEADER: "999999"}))
        # Another user's membership, and two selections naming different accounts.
        with srv.client(s.b.owner_key) as b_owner:
            b_members = data(b_owner.get(f"/v1/accounts/{s.b.id}/members"))["members"]
        owners = [m["id"] for m in b_members if m["role"] == "owner"]
        refused(u.get("/v1/clusters", params={"active_iam": owners[0]}))
        refused(u.get("/v1/clusters", params={"active_iam": s.u_in_b}, headers={HEADER: "1"}))
        # Malformed selections are the request's fault.
        refused(u.get("/v1/clusters", headers={HEADER: "b"}), 400, "VALIDATION_ERROR")
        refused(u.get("/v1/clusters", params={"active_iam": "x"}), 400, "VALIDATION_ERROR")
    # The fast read path of GET /v1/clusters/{id} takes the same selection.
    with srv.client(s.a.owner_key) as a_owner:
        refused(a_owner.get(f"/v1/clusters/{s.b_cluster}", headers={HEADER: str(s.b.id)}))


def test_a_key_restricted_to_its_account_cannot_switch(srv: LiveServer, setup: Setup) -> None:
    s = setup
    with srv.client(s.u_key) as u:
        body = {"name": "ci", "scope": "write", "restrict_to_account": True}
        restricted = data(u.post("/v1/api-keys", json=body), 201)["key"]
    with srv.client(restricted) as r:
        assert ids(r.get("/v1/clusters")) == {s.a_cluster}
        refused(r.get("/v1/clusters", headers={HEADER: str(s.b.id)}))
        refused(r.get("/v1/clusters", params={"active_iam": s.u_in_b}))
        refused(r.get(f"/v1/clusters/{s.b_cluster}", headers={HEADER: str(s.b.id)}))


def test_graphql_and_training_api_take_the_selection(srv: LiveServer, setup: Setup) -> None:
    s = setup
    query = {"query": "{ myself { clusters { id } } }"}
    auth = {"Authorization": f"Bearer {s.u_key}"}

    def pods(**kw: Any) -> Any:
        r = httpx.post(f"{srv.url}/graphql", json=query, timeout=30, **kw, verify=trusted_tls())
        assert r.status_code in (200, 403), r.text
        return r

    def listed(r: httpx.Response) -> set[str]:
        return {p["id"] for p in r.json()["data"]["myself"]["clusters"]}

    assert listed(pods(headers=auth)) == {s.a_cluster}
    assert listed(pods(headers={**auth, HEADER: str(s.b.id)})) == {s.b_cluster}
    assert listed(pods(headers=auth, params={"active_iam": s.u_in_b})) == {s.b_cluster}
    denied = pods(headers={**auth, HEADER: str(s.c.id)})
    assert denied.status_code == 403
    assert denied.json()["errors"][0]["extensions"]["code"] == "FORBIDDEN"
    # A viewer in B may not stop B's cluster through GraphQL either.
    stop = {"query": f'mutation {{ podStop(input: {{podId: "{s.b_cluster}"}}) {{ id }} }}'}
    r = httpx.post(
        f"{srv.url}/graphql", json=stop, headers={**auth, HEADER: str(s.b.id)}, verify=trusted_tls()
    )
    assert r.json()["errors"][0]["extensions"]["code"] == "FORBIDDEN"
    # Seed 002: active_iam selects B's project; the viewer reads, and may not create.
    with srv.client(s.u_key) as u:
        scope = {"project_id": s.b.project_id, "location": "local", "active_iam": s.u_in_b}
        r = u.get("/distributed_jobs_v2/cluster/", params=scope)
        assert r.status_code == 200, r.text
        r = u.post("/distributed_jobs_v2/cluster/", params=scope, json={})
        assert r.status_code == 403 and r.json()["errors"]["code"] == "FORBIDDEN", r.text
        # Without the selection B's project is another account's: 404.
        r = u.get("/distributed_jobs_v2/cluster/", params={**scope, "active_iam": None})
        assert r.status_code == 404, r.text


def test_a_key_restricted_to_a_project(srv: LiveServer, setup: Setup) -> None:
    s = setup
    with srv.client(s.a.owner_key) as owner:
        p2 = data(owner.post("/v1/projects", json={"name": "p2"}), 201)["id"]
        body = {"name": "p2 only", "scope": "write", "project_id": p2}
        key = data(owner.post("/v1/api-keys", json=body), 201)["key"]
    with srv.client(key) as k:
        mine = data(k.post("/v1/clusters", json=CLUSTER), 201)
        assert mine["project_id"] == p2  # creates land in its project
        assert srv.server.reconciler.wait_idle(10)
        assert ids(k.get("/v1/clusters")) == {mine["id"]}
        assert ids(k.get("/v1/clusters", params={"project_id": s.a.project_id})) == set()
        data(k.get(f"/v1/clusters/{mine['id']}"))
        # The default project's cluster reads as none, by every path.
        other = s.a_cluster
        refused(k.get(f"/v1/clusters/{other}"), 404, "CLUSTER_NOT_FOUND")
        refused(
            k.get(f"/v1/clusters/{other}", headers={HEADER: str(s.a.id)}), 404, "CLUSTER_NOT_FOUND"
        )
        refused(k.get(f"/v2/clusters/{other}"), 404, "CLUSTER_NOT_FOUND")
        refused(k.post(f"/v1/clusters/{other}/stop"), 404, "CLUSTER_NOT_FOUND")
        refused(k.get(f"/v1/clusters/{other}/events"), 404, "CLUSTER_NOT_FOUND")
        refused(k.get(f"/v1/clusters/{other}/logs"), 404, "CLUSTER_NOT_FOUND")
        refused(k.get(f"/v1/clusters/{other}/ports/8888/open"), 404, "CLUSTER_NOT_FOUND")
        # A create naming another project is 404 too.
        body = {**CLUSTER, "project_id": s.a.project_id}
        refused(k.post("/v1/clusters", json=body), 404, "NOT_FOUND")
        # Project-scoped resources: its own project by default, another one is 404.
        other_project = {"project_id": s.a.project_id}
        assert data(k.get("/v1/security-groups")) is not None
        refused(k.get("/v1/security-groups", params=other_project), 404, "PROJECT_NOT_FOUND")
        refused(k.get("/v1/reserved-ips", params=other_project), 404, "PROJECT_NOT_FOUND")
        jobs = {"project_id": s.a.project_id, "location": "local"}
        r = k.get("/distributed_jobs_v2/cluster/", params=jobs)
        assert r.status_code == 404, r.text
        r = k.get("/distributed_jobs_v2/cluster/", params={**jobs, "project_id": p2})
        assert r.status_code == 200, r.text
    gql = srv.graphql("{ myself { clusters { id } } }", key=key)
    assert [p["id"] for p in gql["data"]["myself"]["clusters"]] == [mine["id"]]
    pod = f'{{ pod(input: {{podId: "{other}"}}) {{ id }} }}'
    gql = srv.graphql(pod, key=key)
    assert gql["errors"][0]["extensions"]["code"] == "CLUSTER_NOT_FOUND"
    # The stop through the project-restricted key changed nothing.
    with srv.client(s.a.owner_key) as owner:
        assert data(owner.get(f"/v1/clusters/{other}"))["status"] == "running"


def test_the_proxy_key_check_acts_for_the_clusters_account(srv: LiveServer, setup: Setup) -> None:
    s = setup

    def check(key: str, cid: str) -> int:
        host = f"{cid}-8888.proxy.localhost:8080"
        r = httpx.get(
            f"{srv.url}/v1/proxy/authorize",
            headers={"X-Forwarded-Host": host, "Authorization": f"Bearer {key}"},
            verify=trusted_tls(),
        )
        return r.status_code

    # v: viewer in A (its key's home), member in B: B's port opens with v's key.
    assert check(s.v_key, s.b_cluster) == 200
    assert check(s.v_key, s.a_cluster) == 403  # a viewer's role in A
    # u: member in A, viewer in B.
    assert check(s.u_key, s.a_cluster) == 200
    assert check(s.u_key, s.b_cluster) == 403
    # A's owner is no member of B: as if there were no such port.
    assert check(s.a.owner_key, s.b_cluster) == 404
    assert check(s.b.owner_key, s.b_cluster) == 200
    with srv.client(s.v_key) as v:
        body = {"name": "ci", "scope": "write", "restrict_to_account": True}
        restricted = data(v.post("/v1/api-keys", json=body), 201)["key"]
    assert check(restricted, s.b_cluster) == 404
