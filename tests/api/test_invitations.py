"""Invitations over real HTTP: create (who may grant what), list, revoke, accept once
(a new user gets a key, an existing user a membership), expiry, concurrent accepts."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import httpx

from gpuyard.api.rest.schemas import tenancy as ts
from gpuyard.services.tenancy.members import hash_token
from gpuyard.store.schema import ApiKey, Invitation
from tests.api.test_accounts import invite_and_accept, new_account
from tests.api.test_resources import data, err
from tests.helpers import LiveServer


def invite(srv: LiveServer, key: str, account_id: int, **body: Any) -> httpx.Response:
    with srv.client(key) as c:
        return c.post(f"/v1/accounts/{account_id}/invitations", json=body)


def accept(srv: LiveServer, token: str, key: str | None = None, **body: Any) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(
        f"{srv.url}/v1/invitations/{token}/accept",
        json=body or None,
        headers=headers,
        timeout=60,  # concurrent accepts queue on one database writer, verify=trusted_tls()
    )


def test_invite_accept_once_new_user_gets_a_key(srv: LiveServer) -> None:
    made = new_account(srv)
    aid, owner = made["account"]["id"], made["api_key"]["key"]
    out = data(
        invite(srv, owner, aid, email="New@Acme.test", role="member"),
        201,
        ts.InvitationCreatedEnvelope,
    )
    token = out["token"]
    assert token.startswith("gyi_")
    assert (
        out["invitation"]["status"] == "pending" and out["invitation"]["email"] == "new@acme.test"
    )
    with srv.server.ctx.read() as s:
        row = s.get(Invitation, out["invitation"]["id"])
        assert (
            row is not None
            and row.token_hash == hash_token(token)
            and token not in str(row.__dict__)
        )
    r = accept(srv, token, name="Newbie")
    got = data(r, 201, ts.InvitationAcceptedEnvelope)
    assert got["membership"]["role"] == "member" and got["membership"]["account_id"] == aid
    assert got["user"]["email"] == "new@acme.test"
    key = got["api_key"]
    assert key["scope"] == "write"
    with srv.client(key["key"]) as c:
        me = c.get("/v1/me").json()["data"]
        assert me["user"]["name"] == "Newbie" and me["acting"]["role"] == "member"
    # Single use.
    e = err(accept(srv, token), 404, "INVITATION_NOT_FOUND")
    assert e["details"]["reason"] == "accepted"
    err(accept(srv, "gyi_" + "x" * 40), 404, "INVITATION_NOT_FOUND")
    with srv.client(owner) as c:
        listed = data(c.get(f"/v1/accounts/{aid}/invitations"), 200, ts.InvitationListEnvelope)
        assert [i["status"] for i in listed["invitations"]] == ["accepted"]
        assert listed["invitations"][0]["accepted_at"]
        # An accepted invitation cannot be revoked.
        err(
            c.delete(f"/v1/accounts/{aid}/invitations/{out['invitation']['id']}"),
            404,
            "INVITATION_NOT_FOUND",
        )


def test_who_may_invite_what(srv: LiveServer) -> None:
    made = new_account(srv)
    aid, owner = made["account"]["id"], made["api_key"]["key"]
    admin = invite_and_accept(srv, owner, aid, "adm@acme.test", "admin")["api_key"]["key"]
    member = invite_and_accept(srv, owner, aid, "dev@acme.test", "member")["api_key"]["key"]
    assert invite(srv, owner, aid, email="o2@acme.test", role="owner").status_code == 201
    assert invite(srv, admin, aid, email="a2@acme.test", role="admin").status_code == 201
    err(invite(srv, admin, aid, email="o3@acme.test", role="owner"), 403, "FORBIDDEN")
    err(invite(srv, member, aid, email="m@acme.test", role="viewer"), 403, "FORBIDDEN")
    assert invite(srv, srv.key, aid, email="op@acme.test", role="owner").status_code == 201
    err(invite(srv, owner, aid, email="bad", role="member"), 400, "VALIDATION_ERROR", "email")
    err(invite(srv, owner, aid, email="x@y.z", role="god"), 400, "VALIDATION_ERROR", "role")
    err(
        invite(srv, owner, aid, email="x@y.z", role="member", project_ids=[999999]),
        400,
        "VALIDATION_ERROR",
        "project_ids",
    )
    other = new_account(srv, name="other", email="z@other.test")
    err(invite(srv, other["api_key"]["key"], aid, email="x@y.z", role="member"), 404, "NOT_FOUND")


def test_revoke_expire_and_conflicts(srv: LiveServer) -> None:
    made = new_account(srv)
    aid, owner = made["account"]["id"], made["api_key"]["key"]
    revoked = invite(srv, owner, aid, email="r@acme.test", role="viewer").json()["data"]
    with srv.client(owner) as c:
        gone = data(
            c.delete(f"/v1/accounts/{aid}/invitations/{revoked['invitation']['id']}"),
            200,
            ts.InvitationEnvelope,
        )
        assert gone["status"] == "revoked"
        err(c.delete(f"/v1/accounts/{aid}/invitations/999999"), 404, "INVITATION_NOT_FOUND")
    e = err(accept(srv, revoked["token"]), 404, "INVITATION_NOT_FOUND")
    assert e["details"]["reason"] == "revoked"

    expired = invite(srv, owner, aid, email="e@acme.test", role="viewer").json()["data"]
    with srv.server.ctx.transaction() as s:
        row = s.get(Invitation, expired["invitation"]["id"])
        assert row is not None
        row.expires_at = row.created_at - timedelta(seconds=1)
    e = err(accept(srv, expired["token"]), 404, "INVITATION_NOT_FOUND")
    assert e["details"]["reason"] == "expired"
    with srv.client(owner) as c:
        statuses = [
            i["status"]
            for i in c.get(f"/v1/accounts/{aid}/invitations").json()["data"]["invitations"]
        ]
        assert statuses == ["expired", "revoked"]

    # The owner is already a member: 409, and the invitation stays pending.
    again = invite(srv, owner, aid, email="owner@acme.test", role="admin").json()["data"]
    err(accept(srv, again["token"], key=owner), 409, "CONFLICT")
    # An existing user joins with a key of theirs and gets no new key; a key of
    # somebody else is refused.
    b = new_account(srv, name="beta", email="bob@beta.test")
    bob_inv = invite(srv, owner, aid, email="bob@beta.test", role="member").json()["data"]
    err(accept(srv, bob_inv["token"], key=owner), 403, "FORBIDDEN")
    joined = data(
        accept(srv, bob_inv["token"], key=b["api_key"]["key"]), 201, ts.InvitationAcceptedEnvelope
    )
    assert joined["api_key"] is None
    err(accept(srv, bob_inv["token"], key="gy_not-a-key"), 401, "UNAUTHORIZED")


def test_concurrent_accepts_exactly_one_wins(srv: LiveServer) -> None:
    made = new_account(srv)
    aid, owner = made["account"]["id"], made["api_key"]["key"]
    token = invite(srv, owner, aid, email="race@acme.test", role="member").json()["data"]["token"]
    statuses: list[int] = []
    barrier = threading.Barrier(8)

    def go() -> None:
        barrier.wait()
        statuses.append(accept(srv, token).status_code)

    threads = [threading.Thread(target=go) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(statuses) == [201] + [404] * 7
    with srv.server.ctx.read() as s:
        keys = s.query(ApiKey).filter(ApiKey.name == "invitation").count()
        assert keys == 1


def test_invited_projects_limit_a_member(srv: LiveServer) -> None:
    made = new_account(srv)
    aid, owner = made["account"]["id"], made["api_key"]["key"]
    with srv.client(owner) as c:
        p = c.post("/v1/projects", json={"name": "lab"}).json()["data"]
    got = invite_and_accept(srv, owner, aid, "lab@acme.test", "member", project_ids=[p["id"]])
    with srv.client(got["api_key"]["key"]) as c:
        assert c.get("/v1/me").json()["data"]["acting"]["project_ids"] == [p["id"]]
    with srv.client(owner) as c:
        members = c.get(f"/v1/accounts/{aid}/members").json()["data"]["members"]
        assert [m["project_ids"] for m in members if m["email"] == "lab@acme.test"] == [[p["id"]]]


def test_only_the_invited_e_mails_user_accepts(srv: LiveServer) -> None:
    """The token alone makes nobody somebody else: an existing user's invitation needs a
    key of theirs (write, unrestricted); a new user is made only with the invited
    e-mail, and only when the request carries no key of another user."""
    made = new_account(srv)
    aid, owner = made["account"]["id"], made["api_key"]["key"]
    b = new_account(srv, name="beta", email="bob@beta.test")
    bob = b["api_key"]["key"]
    with srv.client(bob) as c:
        made_key = c.post("/v1/api-keys", json={"name": "ro", "scope": "read"})
        bob_read = made_key.json()["data"]["key"]
    mallory = new_account(srv, name="evil", email="mallory@evil.test")["api_key"]["key"]

    bob_inv = invite(srv, owner, aid, email="bob@beta.test", role="admin").json()["data"]
    token = bob_inv["token"]
    # Without a key the token holder would join Bob's user to the account: refused.
    err(accept(srv, token), 401, "UNAUTHORIZED")
    err(accept(srv, token, key=mallory), 403, "FORBIDDEN")
    err(accept(srv, token, key=bob_read), 403, "FORBIDDEN")
    with srv.client(owner) as c:
        members = c.get(f"/v1/accounts/{aid}/members").json()["data"]["members"]
        assert [m["email"] for m in members] == ["owner@acme.test"]
        listed = c.get(f"/v1/accounts/{aid}/invitations").json()["data"]["invitations"]
        assert [i["status"] for i in listed] == ["pending"]
    joined = data(accept(srv, token, key=bob), 201, ts.InvitationAcceptedEnvelope)
    assert joined["user"]["email"] == "bob@beta.test" and joined["api_key"] is None

    # An e-mail nobody has yet: another user's key does not take it over...
    new_inv = invite(srv, owner, aid, email="carol@acme.test", role="member").json()["data"]
    err(accept(srv, new_inv["token"], key=mallory), 403, "FORBIDDEN")
    # ... and the token makes exactly the invited e-mail's user (no other e-mail can be
    # named: the body has no such field).
    err(accept(srv, new_inv["token"], email="mallory@evil.test"), 400, "VALIDATION_ERROR")
    carol = data(accept(srv, new_inv["token"]), 201, ts.InvitationAcceptedEnvelope)
    assert carol["user"]["email"] == "carol@acme.test"
