"""A key restricted to a project stays restricted, over real HTTP: whatever its user's
role, it acts only inside its project. Invitations, members, the account's projects and
quotas, audit, bills and budget settings, and other users' keys need a key that is not
restricted (docs/roles.md "Acting for an account")."""

from __future__ import annotations

from typing import Any

import httpx

from gpuyard.api.rest.schemas import resources as rs
from gpuyard.api.rest.schemas import tenancy as ts
from gpuyard.core.tls_trust import trusted_tls
from gpuyard.services.tenancy.cluster_access import Need, key_may_access
from tests.api.test_accounts import invite_and_accept, new_account
from tests.api.test_resources import data, err
from tests.helpers import LiveServer

A6000 = "NVIDIA RTX A6000"


def restricted(body: dict[str, Any]) -> None:
    """The refusal names the key's project (a restriction, not the role)."""
    assert body["details"]["restricted_to_project"] is not None, body


def test_an_owners_key_restricted_to_a_project_acts_only_inside_it(srv: LiveServer) -> None:
    made = new_account(srv)
    aid, owner = made["account"]["id"], made["api_key"]["key"]
    home = made["project"]["id"]
    admin = invite_and_accept(srv, owner, aid, "adm@acme.test", "admin")
    with srv.client(owner) as c:
        lab = data(c.post("/v1/projects", json={"name": "lab"}), 201, rs.ProjectEnvelope)["id"]
        made_key = c.post("/v1/api-keys", json={"name": "ci", "scope": "write", "project_id": home})
        ci = data(made_key, 201, ts.ApiKeyCreatedEnvelope)["key"]
    acc = f"/v1/accounts/{aid}"
    with srv.client(ci) as c:
        # No invitation of any role: the chain "invite an owner, accept it without a
        # key, hold an unrestricted owner key" ends at its first step.
        for role in ("owner", "admin", "viewer"):
            body = {"email": f"{role}@evil.test", "role": role}
            restricted(err(c.post(f"{acc}/invitations", json=body), 403, "FORBIDDEN"))
        err(c.get(f"{acc}/invitations"), 403, "FORBIDDEN")
        # Nor members.
        member_id = admin["membership"]["id"]
        err(c.patch(f"{acc}/members/{member_id}", json={"role": "viewer"}), 403, "FORBIDDEN")
        err(c.delete(f"{acc}/members/{member_id}"), 403, "FORBIDDEN")
        # Nor the account's projects: none made, renamed or deleted; the list is its own.
        restricted(err(c.post("/v1/projects", json={"name": "x"}), 403, "FORBIDDEN"))
        err(c.patch(f"/v1/projects/{lab}", json={"name": "y"}), 403, "FORBIDDEN")
        err(c.patch(f"/v1/projects/{home}", json={"name": "y"}), 403, "FORBIDDEN")
        err(c.delete(f"/v1/projects/{lab}"), 403, "FORBIDDEN")
        listed = data(c.get("/v1/projects"), 200, rs.ProjectListEnvelope)["projects"]
        assert [p["id"] for p in listed] == [home]
        err(c.post(f"/v1/projects/{lab}/members", json={"member_id": member_id}), 403, "FORBIDDEN")
        # Nor quotas, of another project or its own.
        for pid in (lab, home):
            put = c.put(f"{acc}/projects/{pid}/quotas", json={"gpus": 1})
            restricted(err(put, 403, "FORBIDDEN"))
        # Nor the audit log, the bills or the budget settings.
        restricted(err(c.get("/v1/audit-events"), 403, "FORBIDDEN"))
        err(c.get("/v1/billing"), 403, "FORBIDDEN")
        err(c.get(f"{acc}/budget"), 403, "FORBIDDEN")
        err(c.patch(f"{acc}/budget", json={"alert_percent": 50}), 403, "FORBIDDEN")
        err(c.get(f"{acc}/credits"), 403, "FORBIDDEN")
        # Nor the account itself.
        err(c.patch(acc, json={"name": "mine"}), 403, "FORBIDDEN")
        # Nor other users' keys: not listed, not revocable.
        err(c.get("/v1/api-keys", params={"all": "true"}), 403, "FORBIDDEN")
        admins_key = admin["api_key"]["id"]
        err(c.delete(f"/v1/api-keys/{admins_key}"), 404, "API_KEY_NOT_FOUND")
        # Nor may it leave the account on its user's behalf.
        me = c.get("/v1/me").json()["data"]["acting"]
        err(c.delete(f"{acc}/members/{me['member_id']}"), 403, "FORBIDDEN")
        # Inside its project it works: a cluster, its own keys (restricted as much).
        made_cluster = c.post("/v1/clusters", json={"gpu_type": A6000, "docker_image": "img"})
        assert made_cluster.status_code == 201, made_cluster.text
        child = c.post("/v1/api-keys", json={"name": "child", "scope": "write"})
        assert data(child, 201, ts.ApiKeyCreatedEnvelope)["project_id"] == home
        mine = data(c.get("/v1/api-keys"), 200, ts.ApiKeyListEnvelope)["api_keys"]
        assert [k["name"] for k in mine] == ["ci", "child"]
        # Its user's unrestricted keys are beyond the project: neither listed nor revoked.
        owners_key = made["api_key"]["id"]
        err(c.delete(f"/v1/api-keys/{owners_key}"), 404, "API_KEY_NOT_FOUND")
        gone = c.delete(f"/v1/api-keys/{mine[1]['id']}")
        assert gone.status_code == 200 and gone.json()["data"]["revoked_at"]
        # Reads every role makes stand: the account and its members.
        assert c.get(acc).status_code == 200
        assert c.get(f"{acc}/members").status_code == 200
    # Nothing changed behind the refusals; the owner's unrestricted key still does it all.
    with srv.client(owner) as c:
        invitations = data(c.get(f"{acc}/invitations"), 200, ts.InvitationListEnvelope)
        assert [i["email"] for i in invitations["invitations"]] == ["adm@acme.test"]
        names = [p["name"] for p in c.get("/v1/projects").json()["data"]["projects"]]
        assert names == ["default", "lab"]
        assert c.get("/v1/audit-events").status_code == 200
    with srv.client(admin["api_key"]["key"]) as c:
        assert c.get("/v1/me").status_code == 200


def test_graphql_refuses_the_accounts_spend_to_a_restricted_key(srv: LiveServer) -> None:
    made = new_account(srv)
    owner, home = made["api_key"]["key"], made["project"]["id"]
    with srv.client(owner) as c:
        ci = c.post("/v1/api-keys", json={"name": "ci", "scope": "write", "project_id": home})
        key = ci.json()["data"]["key"]
    body = srv.graphql("{ myself { currentSpendPerHr } }", key=key)
    assert [e["path"] for e in body["errors"]] == [["myself", "currentSpendPerHr"]]
    assert body["errors"][0]["extensions"]["code"] == "FORBIDDEN"
    assert srv.graphql("{ myself { clusters { id } } }", key=key)["data"]["myself"] == {
        "clusters": []
    }
    unrestricted = srv.graphql("{ myself { currentSpendPerHr } }", key=owner)
    assert "errors" not in unrestricted


def test_an_operators_key_restricted_to_a_project_is_no_operators(srv: LiveServer) -> None:
    with srv.client() as c:
        home = c.get("/v1/projects").json()["data"]["projects"][0]["id"]
        made = c.post("/v1/api-keys", json={"name": "ci", "scope": "admin", "project_id": home})
        key = data(made, 201, ts.ApiKeyCreatedEnvelope)["key"]
    with srv.client(key) as c:
        body = {"name": "other", "owner_email": "x@other.test"}
        err(c.post("/v1/accounts", json=body), 403, "FORBIDDEN")
        err(c.get("/v1/hosts"), 403, "FORBIDDEN")
        listed = c.get("/v1/accounts").json()["data"]["accounts"]
        assert len(listed) == 1


def test_a_restricted_key_does_not_accept_invitations(srv: LiveServer) -> None:
    a = new_account(srv)
    b = new_account(srv, name="beta", email="bob@beta.test")
    bob = b["api_key"]["key"]
    with srv.client(bob) as c:
        made = c.post("/v1/api-keys", json={"name": "ci", "project_id": b["project"]["id"]})
        ci = made.json()["data"]["key"]
    with srv.client(a["api_key"]["key"]) as c:
        body = {"email": "bob@beta.test", "role": "owner"}
        token = c.post(f"/v1/accounts/{a['account']['id']}/invitations", json=body).json()
    accept = f"{srv.url}/v1/invitations/{token['data']['token']}/accept"
    r = httpx.post(accept, json={}, headers={"Authorization": f"Bearer {ci}"}, verify=trusted_tls())
    err(r, 403, "FORBIDDEN")
    r = httpx.post(
        accept, json={}, headers={"Authorization": f"Bearer {bob}"}, verify=trusted_tls()
    )
    assert r.status_code == 201, r.text


def test_a_console_session_of_a_restricted_key_is_as_restricted(srv: LiveServer) -> None:
    made = new_account(srv)
    aid, owner, home = made["account"]["id"], made["api_key"]["key"], made["project"]["id"]
    with srv.client(owner) as c:
        ci = c.post("/v1/api-keys", json={"name": "ci", "project_id": home}).json()["data"]
    with httpx.Client(base_url=srv.url, timeout=30, verify=trusted_tls()) as browser:
        signed = browser.post("/v1/console/session", json={"api_key": ci["key"]})
        assert signed.status_code == 201, signed.text
        session = signed.json()["data"]
        assert session["key"]["restricted_to_project"] == home
        csrf = {"X-CSRF-Token": session["csrf_token"]}
        body = {"email": "x@evil.test", "role": "owner"}
        r = browser.post(f"/v1/accounts/{aid}/invitations", json=body, headers=csrf)
        restricted(err(r, 403, "FORBIDDEN"))
        err(browser.get("/v1/audit-events", headers=csrf), 403, "FORBIDDEN")


def test_a_members_restricted_key_loses_the_project_its_user_loses(srv: LiveServer) -> None:
    """A member given projects 2 and 3 pins a key to 2; once 2 is taken from them the
    key acts in no project (REST and GraphQL), as the SSH gateway's AccessIndex says."""
    made = new_account(srv)
    aid, owner = made["account"]["id"], made["api_key"]["key"]
    with srv.client(owner) as c:
        lab = data(c.post("/v1/projects", json={"name": "lab"}), 201, rs.ProjectEnvelope)["id"]
        ops = data(c.post("/v1/projects", json={"name": "ops"}), 201, rs.ProjectEnvelope)["id"]
    carol = invite_and_accept(srv, owner, aid, "carol@acme.test", "member", project_ids=[lab, ops])
    with srv.client(carol["api_key"]["key"]) as c:
        made_key = c.post("/v1/api-keys", json={"name": "lab", "project_id": lab})
        pinned = data(made_key, 201, ts.ApiKeyCreatedEnvelope)
    with srv.client(pinned["key"]) as c:
        body = {"gpu_type": A6000, "docker_image": "img", "project_id": lab}
        cluster = c.post("/v1/clusters", json=body)
        assert cluster.status_code == 201, cluster.text
        cluster_id = cluster.json()["data"]["id"]
    with srv.client(owner) as c:
        gone = c.delete(f"/v1/projects/{lab}/members/{carol['membership']['id']}")
        assert gone.status_code in (200, 204), gone.text
    with srv.client(pinned["key"]) as c:
        err(c.get(f"/v1/clusters/{cluster_id}"), 404, "CLUSTER_NOT_FOUND")
        for params in ({"project_id": lab}, {}):
            listed_rest = c.get("/v1/clusters", params=params)
            assert listed_rest.status_code == 200, listed_rest.text
            assert listed_rest.json()["data"]["clusters"] == []
        for project in ({"project_id": lab}, {"project_id": ops}, {}):
            body = {"gpu_type": A6000, "docker_image": "img", **project}
            r = c.post("/v1/clusters", json=body)
            assert r.status_code in (403, 404), r.text
    listed = srv.graphql("{ myself { clusters { id } } }", key=pinned["key"])
    assert listed["data"]["myself"] == {"clusters": []}, listed
    # The gateway's view agrees: the key may not touch the project.
    ctx = srv.server.ctx
    with ctx.read() as session:
        for need in (Need.READ, Need.WRITE):
            assert not key_may_access(session, pinned["id"], aid, lab, need)
    # The member's unrestricted key still works in the project they keep.
    with srv.client(carol["api_key"]["key"]) as c:
        body = {"gpu_type": A6000, "docker_image": "img", "project_id": ops}
        assert c.post("/v1/clusters", json=body).status_code == 201


def test_a_restricted_key_of_a_member_of_every_project_keeps_working(srv: LiveServer) -> None:
    """A member with no project rows acts in every project: a key pinned to one works."""
    made = new_account(srv)
    aid, owner, home = made["account"]["id"], made["api_key"]["key"], made["project"]["id"]
    carol = invite_and_accept(srv, owner, aid, "carol@acme.test", "member")
    with srv.client(carol["api_key"]["key"]) as c:
        made_key = c.post("/v1/api-keys", json={"name": "home", "project_id": home})
        pinned = data(made_key, 201, ts.ApiKeyCreatedEnvelope)["key"]
    with srv.client(pinned) as c:
        r = c.post("/v1/clusters", json={"gpu_type": A6000, "docker_image": "img"})
        assert r.status_code == 201, r.text
        assert r.json()["data"]["project_id"] == home
