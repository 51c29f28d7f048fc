"""``/v1/ssh-keys`` with several members, over real HTTP: a key records who registered
it (and the project of a project-restricted API key), a caller limited to a project
sees its own keys and that project's (a key restricted to a project: that project's
only), and removing another member's key takes ``manage_members`` and a role that may
manage the keys of that member's role."""

from __future__ import annotations

from typing import Any

import asyncssh
import pytest

from gpuyard.services.tenancy import members, projects
from gpuyard.services.tenancy.auth import resolve_key
from tests.helpers import LiveServer


def pub() -> str:
    return asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().strip()


def add(srv: LiveServer, key: str, name: str) -> dict[str, Any]:
    with srv.client(key) as c:
        r = c.post("/v1/ssh-keys", json={"name": name, "public_key": pub()})
        assert r.status_code == 201, r.text
        made: dict[str, Any] = r.json()["data"]
        return made


def names(srv: LiveServer, key: str) -> list[str]:
    with srv.client(key) as c:
        r = c.get("/v1/ssh-keys")
        assert r.status_code == 200, r.text
        return [k["name"] for k in r.json()["data"]["ssh_keys"]]


@pytest.fixture
def team(srv: LiveServer) -> dict[str, Any]:
    ctx = srv.server.ctx
    with ctx.read() as session:
        owner = resolve_key(session, srv.key)
    other = projects.create_project(ctx, owner, None, "other").id
    inv = members.create_invitation(
        ctx, owner, owner.account_id, "carol@example.com", "member", None
    )
    carol = members.accept_invitation(ctx, inv.token, name=None, caller=None)
    with srv.client(carol["api_key"]["key"]) as c:
        r = c.post("/v1/api-keys", json={"name": "pinned", "project_id": other})
        assert r.status_code == 201, r.text
        pinned = r.json()["data"]["key"]
    return {
        "owner": owner,
        "other": other,
        "carol": carol["api_key"]["key"],
        "carol_id": carol["user"]["id"],
        "pinned": pinned,
    }


def test_keys_record_their_owner_and_project(srv: LiveServer, team: dict[str, Any]) -> None:
    mine = add(srv, srv.key, "owners")
    carols = add(srv, team["carol"], "carols")
    pinned = add(srv, team["pinned"], "pinned")
    assert (mine["user_id"], mine["project_id"]) == (team["owner"].user_id, None)
    assert (carols["user_id"], carols["project_id"]) == (team["carol_id"], None)
    assert (pinned["user_id"], pinned["project_id"]) == (team["carol_id"], team["other"])
    # Unlimited callers see every key of the account; a project key only its
    # project's (not even its user's others).
    assert names(srv, srv.key) == ["owners", "carols", "pinned"]
    assert names(srv, team["carol"]) == ["owners", "carols", "pinned"]
    assert names(srv, team["pinned"]) == ["pinned"]
    with srv.client(team["pinned"]) as c:
        r = c.get(f"/v1/ssh-keys/{mine['id']}")
        assert r.status_code == 404 and r.json()["error"]["code"] == "SSH_KEY_NOT_FOUND"


def test_only_the_owner_of_a_key_or_a_member_manager_removes_it(
    srv: LiveServer, team: dict[str, Any]
) -> None:
    mine = add(srv, srv.key, "owners")
    carols = add(srv, team["carol"], "carols")
    with srv.client(team["carol"]) as c:
        r = c.delete(f"/v1/ssh-keys/{mine['id']}")
        assert r.status_code == 403 and r.json()["error"]["code"] == "FORBIDDEN", r.text
    with srv.client(srv.key) as c:
        assert c.delete(f"/v1/ssh-keys/{carols['id']}").status_code == 200
    assert names(srv, srv.key) == ["owners"]


UPDATE = "mutation($k: String) { updateUserSettings(input: {pubKey: $k}) { id pubKey } }"


def test_a_project_key_touches_only_its_projects_ssh_keys(
    srv: LiveServer, team: dict[str, Any]
) -> None:
    """A key restricted to a project neither sees, deletes nor replaces its user's SSH
    keys outside that project (unrestricted ones, or another project's)."""
    carols = add(srv, team["carol"], "carols")
    with srv.client(team["carol"]) as c:
        home = team["owner"].default_project_id
        made = c.post("/v1/api-keys", json={"name": "home", "project_id": home})
        assert made.status_code == 201, made.text
    homes = add(srv, made.json()["data"]["key"], "homes")
    add(srv, team["pinned"], "pinned")
    with srv.client(team["pinned"]) as c:
        for beyond in (carols, homes):
            r = c.delete(f"/v1/ssh-keys/{beyond['id']}")
            assert r.status_code == 404, r.text
            assert r.json()["error"]["code"] == "SSH_KEY_NOT_FOUND"
    assert names(srv, team["pinned"]) == ["pinned"]
    assert names(srv, team["carol"]) == ["carols", "homes", "pinned"]


def test_a_project_keys_pub_key_replaces_only_its_projects_ssh_keys(
    srv: LiveServer, team: dict[str, Any]
) -> None:
    """RunPod's pubKey, set through a key restricted to a project, replaces that
    project's keys of its user only: their unrestricted keys stay."""
    add(srv, team["carol"], "carols")
    pinned = add(srv, team["pinned"], "pinned")
    fresh = pub()
    answer = srv.graphql(UPDATE, {"k": fresh}, key=team["pinned"])
    assert "errors" not in answer, answer
    assert answer["data"]["updateUserSettings"]["pubKey"] == fresh
    left = names(srv, team["carol"])
    assert "carols" in left and "pinned" not in left, left
    with srv.client(team["carol"]) as c:
        r = c.get(f"/v1/ssh-keys/{pinned['id']}")
        assert r.status_code == 404, r.text


def test_an_admin_does_not_remove_an_owners_ssh_key(srv: LiveServer, team: dict[str, Any]) -> None:
    """As for API keys (core/roles.py ``can_manage_keys_of``): an admin manages the
    SSH keys of members, not of owners."""
    ctx = srv.server.ctx
    owner = team["owner"]
    inv = members.create_invitation(ctx, owner, owner.account_id, "ann@example.com", "admin", None)
    ann = members.accept_invitation(ctx, inv.token, name=None, caller=None)["api_key"]["key"]
    mine = add(srv, srv.key, "owners")
    carols = add(srv, team["carol"], "carols")
    with srv.client(ann) as c:
        r = c.delete(f"/v1/ssh-keys/{mine['id']}")
        assert r.status_code == 403 and r.json()["error"]["code"] == "FORBIDDEN", r.text
        assert c.delete(f"/v1/ssh-keys/{carols['id']}").status_code == 200
    assert names(srv, srv.key) == ["owners"]
