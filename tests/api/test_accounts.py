"""Accounts, members, ``/v1/me``, API keys and projects' members over real HTTP (the
real app, SQLite, the fake runtime): every route's answer validated against its
documented model, refusals in the v1 envelope, another account's things 404."""

from __future__ import annotations

import json
from typing import Any

import httpx

from gpuyard.api.rest.schemas import resources as rs
from gpuyard.api.rest.schemas import tenancy as ts
from gpuyard.core.tls_trust import trusted_tls
from gpuyard.store.schema import Cluster
from tests.api.test_resources import data, err
from tests.helpers import LiveServer

A6000 = "NVIDIA RTX A6000"


def new_account(
    srv: LiveServer, name: str = "acme", email: str = "owner@acme.test"
) -> dict[str, Any]:
    with srv.client() as c:
        made: dict[str, Any] = data(
            c.post("/v1/accounts", json={"name": name, "owner_email": email}),
            201,
            ts.AccountCreatedEnvelope,
        )
    return made


def header(account_id: int) -> dict[str, str]:
    return {"X-Gpuyard-Account": str(account_id)}


def invite_and_accept(
    srv: LiveServer,
    owner_key: str,
    account_id: int,
    email: str,
    role: str,
    key: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """``email`` invited as ``role`` and accepted: without a key (a new user), or with
    ``key`` (an existing user's own)."""
    with srv.client(owner_key) as c:
        inv = data(
            c.post(
                f"/v1/accounts/{account_id}/invitations",
                json={"email": email, "role": role, **extra},
            ),
            201,
            ts.InvitationCreatedEnvelope,
        )
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    r = httpx.post(
        f"{srv.url}/v1/invitations/{inv['token']}/accept",
        json={},
        headers=headers,
        verify=trusted_tls(),
    )
    accepted: dict[str, Any] = data(r, 201, ts.InvitationAcceptedEnvelope)
    return accepted


def test_operator_creates_account_with_owner_project_and_key(srv: LiveServer) -> None:
    made = new_account(srv, email="  Owner@ACME.test ")
    assert made["owner"]["email"] == "owner@acme.test"
    assert made["account"]["status"] == "active" and made["account"]["member_count"] == 1
    assert made["project"]["is_default"] is True
    key = made["api_key"]
    assert key["key"].startswith("gy_") and key["scope"] == "write"
    with srv.client(key["key"]) as c:
        me = data(c.get("/v1/me"), 200, ts.MeEnvelope)
        assert me["user"]["email"] == "owner@acme.test"
        assert me["acting"]["account_id"] == made["account"]["id"]
        assert me["acting"]["role"] == "owner"
        projects = c.get("/v1/projects").json()["data"]["projects"]
        assert [p["id"] for p in projects] == [made["project"]["id"]]
        # Only the operator creates accounts.
        err(c.post("/v1/accounts", json={"name": "x", "owner_email": "x@y.z"}), 403, "FORBIDDEN")
        # A member sees only their accounts.
        listed = data(c.get("/v1/accounts"), 200, ts.AccountListEnvelope)
        assert [a["id"] for a in listed["accounts"]] == [made["account"]["id"]]

    # The same e-mail again: the existing user owns the second account too, with a key
    # for that account.
    second = new_account(srv, name="acme-2", email="owner@acme.test")
    assert second["owner"]["user_id"] == made["owner"]["user_id"]
    with srv.client(second["api_key"]["key"]) as c:
        me = c.get("/v1/me").json()["data"]
        assert me["acting"]["account_id"] == second["account"]["id"]
        assert {m["account_id"] for m in me["memberships"]} == {
            made["account"]["id"],
            second["account"]["id"],
        }
    with srv.client() as c:
        everything = data(
            c.get("/v1/accounts", params={"per_page": 2}), 200, ts.AccountListEnvelope
        )
        assert everything["total"] == 3 and len(everything["accounts"]) == 2
        page2 = c.get("/v1/accounts", params={"per_page": 2, "page": 2}).json()["data"]
        assert [a["id"] for a in page2["accounts"]] == [second["account"]["id"]]
        err(
            c.post("/v1/accounts", json={"name": "x", "owner_email": "nope"}),
            400,
            "VALIDATION_ERROR",
            "owner_email",
        )
        err(
            c.post("/v1/accounts", json={"name": "", "owner_email": "a@b.c"}),
            400,
            "VALIDATION_ERROR",
            "name",
        )
        err(c.post("/v1/accounts", json={"name": "x"}), 400, "VALIDATION_ERROR", "owner_email")
        err(c.get("/v1/accounts", params={"page": 0}), 400, "VALIDATION_ERROR", "page")
        err(c.get("/v1/accounts/999999"), 404, "NOT_FOUND")


def test_get_and_rename_account_and_other_accounts_are_404(srv: LiveServer) -> None:
    a = new_account(srv)
    b = new_account(srv, name="other", email="b@other.test")
    aid, bid = a["account"]["id"], b["account"]["id"]
    with srv.client(a["api_key"]["key"]) as c:
        got = data(c.get(f"/v1/accounts/{aid}"), 200, ts.AccountEnvelope)
        assert got["name"] == "acme"
        renamed = data(
            c.patch(f"/v1/accounts/{aid}", json={"name": "Acme Inc"}), 200, ts.AccountEnvelope
        )
        assert renamed["name"] == "Acme Inc"
        # Status is the operator's.
        err(c.patch(f"/v1/accounts/{aid}", json={"status": "suspended"}), 403, "FORBIDDEN")
        for path in (
            f"/v1/accounts/{bid}",
            f"/v1/accounts/{bid}/members",
            f"/v1/accounts/{bid}/invitations",
        ):
            err(c.get(path), 404, "NOT_FOUND")
        err(c.patch(f"/v1/accounts/{bid}", json={"name": "mine"}), 404, "NOT_FOUND")
        err(c.patch(f"/v1/accounts/{aid}", json={}), 400, "VALIDATION_ERROR")
        err(
            c.patch(f"/v1/accounts/{aid}", json={"status": "gone"}),
            400,
            "VALIDATION_ERROR",
            "status",
        )
    # An admin (not owner) may not rename the account.
    admin = invite_and_accept(srv, a["api_key"]["key"], aid, "adm@acme.test", "admin")
    with srv.client(admin["api_key"]["key"]) as c:
        err(c.patch(f"/v1/accounts/{aid}", json={"name": "x"}), 403, "FORBIDDEN")
    with srv.client() as c:  # the operator sees and renames every account
        assert c.get(f"/v1/accounts/{bid}").status_code == 200
        assert c.patch(f"/v1/accounts/{bid}", json={"name": "B"}).json()["data"]["name"] == "B"


def test_suspension_stops_clusters_and_keeps_volumes_resume_allows_starts(
    srv: LiveServer,
) -> None:
    made = new_account(srv)
    aid = made["account"]["id"]
    body = {"gpu_type": A6000, "gpu_count": 1, "docker_image": "img", "volume_gb": 5}
    with srv.client(made["api_key"]["key"]) as c:
        r = c.post("/v1/clusters", json=body)
        assert r.status_code == 201, r.text
        cid = r.json()["data"]["id"]
        assert srv.server.reconciler.wait_idle(20)
        assert c.get(f"/v1/clusters/{cid}").json()["data"]["status"] == "running"
    volumes_before = set(srv.server.app.state.gpuyard.runtime.volumes)

    with srv.client() as op:
        suspended = data(
            op.patch(
                f"/v1/accounts/{aid}", json={"status": "suspended", "reason": "unpaid invoice"}
            ),
            200,
            ts.AccountEnvelope,
        )
        assert suspended["status"] == "suspended"
        assert suspended["status_reason"] == "unpaid invoice"
    assert srv.server.reconciler.wait_idle(20)
    with srv.server.ctx.read() as s:
        cluster = s.get(Cluster, cid)
        assert cluster is not None and cluster.status == "stopped"
    # The volume is kept.
    assert volumes_before <= set(srv.server.app.state.gpuyard.runtime.volumes)

    with srv.client(made["api_key"]["key"]) as c:
        # Reads work.
        events = c.get(f"/v1/clusters/{cid}/events").json()["data"]
        assert "account suspended: unpaid invoice" in str(events)
        assert c.get(f"/v1/clusters/{cid}").status_code == 200
        # New work does not.
        err(c.post(f"/v1/clusters/{cid}/start", json={}), 403, "ACCOUNT_SUSPENDED")
        err(c.post("/v1/clusters", json=body), 403, "ACCOUNT_SUSPENDED")
        err(
            c.post("/v1/networkvolumes", json={"name": "d", "size": 10, "dataCenterId": "local"}),
            403,
            "ACCOUNT_SUSPENDED",
        )
        err(c.post(f"/v1/clusters/{cid}/snapshots", json={"name": "s"}), 403, "ACCOUNT_SUSPENDED")

    with srv.client() as op:
        resumed = op.patch(f"/v1/accounts/{aid}", json={"status": "active"}).json()["data"]
        assert resumed["status"] == "active" and resumed["status_reason"] is None
    with srv.server.ctx.read() as s:
        cluster = s.get(Cluster, cid)
        assert cluster is not None and cluster.status == "stopped"  # not started for them
    with srv.client(made["api_key"]["key"]) as c:
        r = c.post(f"/v1/clusters/{cid}/start", json={})
        assert r.status_code in (200, 202), r.text
        assert srv.server.reconciler.wait_idle(20)
        assert c.get(f"/v1/clusters/{cid}").json()["data"]["status"] == "running"
    with srv.client(made["api_key"]["key"]) as c:
        actions = [e["action"] for e in c.get("/v1/audit-events").json()["data"]["events"]]
        assert actions[:2] == ["account.resume", "account.suspend"]


def test_members_roles_and_removal(srv: LiveServer) -> None:
    made = new_account(srv)
    aid = made["account"]["id"]
    owner_key = made["api_key"]["key"]
    admin = invite_and_accept(srv, owner_key, aid, "adm@acme.test", "admin")
    member = invite_and_accept(srv, owner_key, aid, "dev@acme.test", "member")
    viewer = invite_and_accept(srv, owner_key, aid, "view@acme.test", "viewer")
    admin_key = admin["api_key"]["key"]
    with srv.client(viewer["api_key"]["key"]) as c:
        listed = data(c.get(f"/v1/accounts/{aid}/members"), 200, ts.MemberListEnvelope)
        assert [m["role"] for m in listed["members"]] == ["owner", "admin", "member", "viewer"]
        owner_member = listed["members"][0]["id"]
        err(
            c.patch(
                f"/v1/accounts/{aid}/members/{member['membership']['id']}", json={"role": "admin"}
            ),
            403,
            "FORBIDDEN",
        )
        err(c.get(f"/v1/accounts/{aid}/invitations"), 403, "FORBIDDEN")
    with srv.client(admin_key) as c:
        mid = member["membership"]["id"]
        changed = data(
            c.patch(f"/v1/accounts/{aid}/members/{mid}", json={"role": "billing"}),
            200,
            ts.MemberEnvelope,
        )
        assert changed["role"] == "billing"
        # Only an owner makes or unmakes owners.
        err(c.patch(f"/v1/accounts/{aid}/members/{mid}", json={"role": "owner"}), 403, "FORBIDDEN")
        err(
            c.patch(f"/v1/accounts/{aid}/members/{owner_member}", json={"role": "admin"}),
            403,
            "FORBIDDEN",
        )
        err(c.delete(f"/v1/accounts/{aid}/members/{owner_member}"), 403, "FORBIDDEN")
        err(
            c.patch(f"/v1/accounts/{aid}/members/{mid}", json={"role": "root"}),
            400,
            "VALIDATION_ERROR",
            "role",
        )
        err(
            c.patch(f"/v1/accounts/{aid}/members/999999", json={"role": "admin"}),
            404,
            "MEMBER_NOT_FOUND",
        )
    with srv.client(owner_key) as c:
        # The last owner can be neither demoted nor removed.
        err(
            c.patch(f"/v1/accounts/{aid}/members/{owner_member}", json={"role": "admin"}),
            409,
            "CONFLICT",
        )
        err(c.delete(f"/v1/accounts/{aid}/members/{owner_member}"), 409, "CONFLICT")
    # Removing a member revokes their keys for this account at once.
    with srv.client(admin_key) as c:
        gone = data(
            c.delete(f"/v1/accounts/{aid}/members/{member['membership']['id']}"),
            200,
            ts.MemberRemovedEnvelope,
        )
        assert gone["keys_revoked"] == 1
    with srv.client(member["api_key"]["key"]) as c:
        err(c.get("/v1/me"), 401, "UNAUTHORIZED")
    # A member may leave on their own.
    with srv.client(viewer["api_key"]["key"]) as c:
        vid = viewer["membership"]["id"]
        assert c.delete(f"/v1/accounts/{aid}/members/{vid}").status_code == 200
        err(c.get("/v1/me"), 401, "UNAUTHORIZED")


def test_existing_user_joins_and_switches_accounts_with_header(srv: LiveServer) -> None:
    a = new_account(srv)
    b = new_account(srv, name="beta", email="bob@beta.test")
    aid, bid = a["account"]["id"], b["account"]["id"]
    bob = b["api_key"]["key"]
    joined = invite_and_accept(srv, a["api_key"]["key"], aid, "bob@beta.test", "member", bob)
    assert joined["api_key"] is None and joined["user"]["id"] == b["owner"]["user_id"]
    with srv.client(b["api_key"]["key"]) as c:
        me = c.get("/v1/me", headers=header(aid)).json()["data"]
        assert me["acting"] == {
            "account_id": aid,
            "role": "member",
            "member_id": joined["membership"]["id"],
            "project_ids": None,
        }
        # active_iam names the same membership.
        via_iam = c.get("/v1/me", params={"active_iam": joined["membership"]["id"]}).json()
        assert via_iam["data"]["acting"]["account_id"] == aid
        projects = c.get("/v1/projects", headers=header(aid)).json()["data"]["projects"]
        assert [p["id"] for p in projects] == [a["project"]["id"]]
        # A member does not manage projects there.
        err(c.post("/v1/projects", json={"name": "x"}, headers=header(aid)), 403, "FORBIDDEN")
        assert c.get(f"/v1/accounts/{bid}").status_code == 200


def test_api_keys_routes(srv: LiveServer) -> None:
    made = new_account(srv)
    aid = made["account"]["id"]
    owner_key = made["api_key"]["key"]
    member = invite_and_accept(srv, owner_key, aid, "dev@acme.test", "member")
    with srv.client(owner_key) as c:
        mine = data(c.get("/v1/api-keys"), 200, ts.ApiKeyListEnvelope)["api_keys"]
        assert [k["id"] for k in mine] == [made["api_key"]["id"]]
        every = c.get("/v1/api-keys", params={"all": "true"}).json()["data"]["api_keys"]
        assert {k["user_email"] for k in every} == {"owner@acme.test", "dev@acme.test"}
        project = c.post("/v1/projects", json={"name": "research"}).json()["data"]
        restricted = data(
            c.post(
                "/v1/api-keys",
                json={"name": "ci", "scope": "read", "project_id": project["id"]},
            ),
            201,
            ts.ApiKeyCreatedEnvelope,
        )
        assert restricted["restricted"] is True and restricted["project_id"] == project["id"]
        assert restricted["account_id"] == aid
        err(c.post("/v1/api-keys", json={"name": "x", "scope": "admin"}), 403, "FORBIDDEN")
        err(
            c.post("/v1/api-keys", json={"name": "x", "scope": "write", "project_id": 999999}),
            404,
            "PROJECT_NOT_FOUND",
        )
        err(
            c.post("/v1/api-keys", json={"name": "", "scope": "read"}),
            400,
            "VALIDATION_ERROR",
            "name",
        )
    with srv.client(restricted["key"]) as c:
        me = c.get("/v1/me").json()["data"]
        assert me["acting"]["project_ids"] == [project["id"]]
        # A read key makes no keys.
        err(c.post("/v1/api-keys", json={"name": "y", "scope": "read"}), 403, "FORBIDDEN")
    with srv.client(member["api_key"]["key"]) as c:
        err(c.get("/v1/api-keys", params={"all": "true"}), 403, "FORBIDDEN")
        # Another user's key is not theirs to see or revoke.
        err(c.delete(f"/v1/api-keys/{restricted['id']}"), 404, "API_KEY_NOT_FOUND")
        own = c.post("/v1/api-keys", json={"name": "laptop", "scope": "write"}).json()["data"]
    with srv.client(own["key"]) as c:
        revoked = data(c.delete(f"/v1/api-keys/{own['id']}"), 200, ts.ApiKeyEnvelope)
        assert revoked["revoked_at"] is not None
        err(c.get("/v1/me"), 401, "UNAUTHORIZED")  # refused at once
    with srv.client(owner_key) as c:  # the owner revokes anyone's key of the account
        assert c.delete(f"/v1/api-keys/{restricted['id']}").status_code == 200
    other = new_account(srv, name="other", email="x@other.test")
    with srv.client(other["api_key"]["key"]) as c:
        err(c.delete(f"/v1/api-keys/{made['api_key']['id']}"), 404, "API_KEY_NOT_FOUND")


def test_project_rename_delete_and_members(srv: LiveServer) -> None:
    made = new_account(srv)
    aid = made["account"]["id"]
    owner_key = made["api_key"]["key"]
    dev = invite_and_accept(srv, owner_key, aid, "dev@acme.test", "member")
    with srv.client(owner_key) as c:
        p = c.post("/v1/projects", json={"name": "research"}).json()["data"]
        renamed = data(
            c.patch(f"/v1/projects/{p['id']}", json={"name": "lab"}), 200, rs.ProjectEnvelope
        )
        assert renamed["name"] == "lab"
        added = data(
            c.post(f"/v1/projects/{p['id']}/members", json={"member_id": dev["membership"]["id"]}),
            201,
            ts.ProjectMemberEnvelope,
        )
        assert added["email"] == "dev@acme.test"
        err(
            c.post(f"/v1/projects/{p['id']}/members", json={"member_id": dev["membership"]["id"]}),
            409,
            "CONFLICT",
        )
        listed = data(c.get(f"/v1/projects/{p['id']}/members"), 200, ts.ProjectMemberListEnvelope)
        assert [m["member_id"] for m in listed["members"]] == [dev["membership"]["id"]]
    # The member now acts only in that project.
    with srv.client(dev["api_key"]["key"]) as c:
        assert c.get("/v1/me").json()["data"]["acting"]["project_ids"] == [p["id"]]
        err(c.patch(f"/v1/projects/{p['id']}", json={"name": "x"}), 403, "FORBIDDEN")
        r = c.post(
            "/v1/clusters",
            json={"gpu_type": A6000, "gpu_count": 1, "docker_image": "img", "project_id": p["id"]},
        )
        assert r.status_code == 201, r.text
        cid = r.json()["data"]["id"]
    assert srv.server.reconciler.wait_idle(20)
    with srv.client(owner_key) as c:
        e = err(c.delete(f"/v1/projects/{p['id']}"), 409, "PROJECT_NOT_EMPTY")
        assert e["details"]["left"]["clusters"] == [cid]
        err(c.delete(f"/v1/projects/{made['project']['id']}"), 409, "CONFLICT")
        assert c.delete(f"/v1/clusters/{cid}").status_code in (200, 202)
        assert srv.server.reconciler.wait_idle(20)
        assert (
            c.delete(f"/v1/projects/{p['id']}/members/{dev['membership']['id']}").status_code == 200
        )
        err(c.delete(f"/v1/projects/{p['id']}/members/{dev['membership']['id']}"), 404, "NOT_FOUND")
        gone = data(c.delete(f"/v1/projects/{p['id']}"), 200, ts.ProjectDeletedEnvelope)
        assert gone == {"id": p["id"], "deleted": True}
        err(c.get(f"/v1/projects/{p['id']}/members"), 404, "PROJECT_NOT_FOUND")
        actions = [e["action"] for e in c.get("/v1/audit-events").json()["data"]["events"]]
        for action in (
            "project.create",
            "project.rename",
            "project_member.add",
            "project_member.remove",
            "project.delete",
        ):
            assert action in actions
    other = new_account(srv, name="o", email="o@o.test")
    with srv.client(other["api_key"]["key"]) as c:
        err(
            c.patch(f"/v1/projects/{made['project']['id']}", json={"name": "x"}),
            404,
            "PROJECT_NOT_FOUND",
        )


def test_cli_accounts_and_invitations(srv: LiveServer) -> None:
    from click.testing import CliRunner

    from gpuyard.cli.main import cli

    env = {
        "GPUYARD_URL": srv.url,
        "GPUYARD_API_KEY": srv.key,
        "GPUYARD_HOME": str(srv.server.ctx.settings.home),
    }

    def run(*args: str, key: str | None = None) -> str:
        result = CliRunner().invoke(
            cli, list(args), env={**env, **({"GPUYARD_API_KEY": key} if key else {})}
        )
        assert result.exit_code == 0, result.output
        return result.output

    out = run("accounts", "create", "clitest", "--owner-email", "cli@acme.test")
    owner_key = out.strip().splitlines()[-1]
    assert owner_key.startswith("gy_") and "clitest" in out
    made = json.loads(run("accounts", "list", "--json"))
    aid = next(a["id"] for a in made["accounts"] if a["name"] == "clitest")
    assert json.loads(run("accounts", "get", str(aid), "--json"))["status"] == "active"
    assert "suspended" in run("accounts", "suspend", str(aid), "--reason", "audit")
    assert json.loads(run("accounts", "resume", str(aid), "--json"))["status"] == "active"
    token = run("accounts", "invite", str(aid), "new@acme.test", "--role", "viewer", key=owner_key)
    token = token.strip().splitlines()[-1]
    assert token.startswith("gyi_")
    # No key is sent on accept (the environment's is the operator's).
    out = run("invitations", "accept", token, "--name", "New")
    assert "joined account" in out and out.strip().splitlines()[-1].startswith("gy_")
    bad = CliRunner().invoke(cli, ["invitations", "accept", token], env=env)
    assert bad.exit_code == 1 and "INVITATION_NOT_FOUND" in bad.output
    denied = CliRunner().invoke(
        cli, ["accounts", "suspend", str(aid)], env={**env, "GPUYARD_API_KEY": owner_key}
    )
    assert denied.exit_code == 1 and "FORBIDDEN" in denied.output
