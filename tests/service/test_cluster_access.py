"""services/tenancy/cluster_access.py on a real store (SQLite and PostgreSQL): whether a user,
or one API key of theirs, may still read or write a project's clusters after each
change that ends or narrows a membership."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from gpuyard.services.clusters import use_cases as uc
from gpuyard.services.clusters.requests import CreateCluster
from gpuyard.services.context import Context
from gpuyard.services.tenancy import api_keys, members, projects
from gpuyard.services.tenancy.auth import Principal, resolve_key
from gpuyard.services.tenancy.cluster_access import (
    Need,
    key_may_access,
    key_may_access_cluster,
    user_may_access,
    user_may_access_cluster,
)


@dataclass
class Team:
    owner: Principal
    carol: Principal  # a member, invited as "member"
    default: int
    other: int


def as_key(ctx: Context, key: str) -> Principal:
    with ctx.read() as s:
        return resolve_key(s, key)


@pytest.fixture
def team(ctx: Context, alice: Principal) -> Team:
    inv = members.create_invitation(
        ctx, alice, alice.account_id, "carol@example.com", "member", None
    )
    accepted = members.accept_invitation(ctx, inv.token, name=None, caller=None)
    carol = as_key(ctx, accepted["api_key"]["key"])
    other = projects.create_project(ctx, alice, None, "other").id
    return Team(alice, carol, alice.default_project_id, other)


def may(ctx: Context, who: Principal, project_id: int, need: Need, **kw: int) -> bool:
    with ctx.read() as s:
        return user_may_access(s, who.user_id, project_id, need, **kw)


def key_may(ctx: Context, who: Principal, project_id: int, need: Need) -> bool:
    with ctx.read() as s:
        return key_may_access(s, who.key_id, who.account_id, project_id, need)


def test_a_member_may_write_until_removed(ctx: Context, team: Team) -> None:
    carol = team.carol
    assert may(ctx, carol, team.default, Need.WRITE) and key_may(
        ctx, carol, team.default, Need.WRITE
    )
    assert carol.member_id is not None
    members.remove_member(ctx, team.owner, team.owner.account_id, carol.member_id)
    assert not may(ctx, carol, team.default, Need.READ)
    assert not key_may(ctx, carol, team.default, Need.READ)
    # The owner is untouched.
    assert may(ctx, team.owner, team.default, Need.WRITE)


def test_demoted_to_viewer_reads_but_no_longer_writes(ctx: Context, team: Team) -> None:
    assert team.carol.member_id is not None
    members.change_role(ctx, team.owner, team.owner.account_id, team.carol.member_id, "viewer")
    assert may(ctx, team.carol, team.default, Need.READ)
    assert not may(ctx, team.carol, team.default, Need.WRITE)
    assert not key_may(ctx, team.carol, team.default, Need.WRITE)
    members.change_role(ctx, team.owner, team.owner.account_id, team.carol.member_id, "billing")
    assert not may(ctx, team.carol, team.default, Need.READ)


def test_project_access_follows_the_project_rows(ctx: Context, team: Team) -> None:
    assert team.carol.member_id is not None
    projects.add_project_member(ctx, team.owner, team.other, team.carol.member_id)
    assert may(ctx, team.carol, team.other, Need.WRITE)
    assert not may(ctx, team.carol, team.default, Need.WRITE)
    assert not key_may(ctx, team.carol, team.default, Need.READ)
    # Another project given, the first taken: access moves with them.
    projects.add_project_member(ctx, team.owner, team.default, team.carol.member_id)
    projects.remove_project_member(ctx, team.owner, team.other, team.carol.member_id)
    assert may(ctx, team.carol, team.default, Need.WRITE)
    assert not may(ctx, team.carol, team.other, Need.WRITE)


def test_revoking_the_last_key_ends_the_users_access(ctx: Context, team: Team) -> None:
    carol = team.carol
    second = api_keys.create_key(
        ctx, carol, name="second", scope="write", restrict_to_account=False, project_id=None
    )
    api_keys.revoke_key(ctx, carol, carol.key_id)
    assert may(ctx, carol, team.default, Need.WRITE)  # the second key still acts
    assert not key_may(ctx, carol, team.default, Need.READ)  # the revoked one does not
    api_keys.revoke_key(ctx, team.owner, second["id"])
    assert not may(ctx, carol, team.default, Need.READ)


def test_a_read_key_or_a_project_key_reaches_no_further(ctx: Context, team: Team) -> None:
    carol = team.carol
    reader = as_key(
        ctx,
        api_keys.create_key(
            ctx, carol, name="r", scope="read", restrict_to_account=False, project_id=None
        )["key"],
    )
    pinned = as_key(
        ctx,
        api_keys.create_key(
            ctx, carol, name="p", scope="write", restrict_to_account=False, project_id=team.other
        )["key"],
    )
    assert key_may(ctx, reader, team.default, Need.READ)
    assert not key_may(ctx, reader, team.default, Need.WRITE)
    assert key_may(ctx, pinned, team.other, Need.WRITE)
    assert not key_may(ctx, pinned, team.default, Need.READ)
    # With only those two keys left, carol writes only to the pinned project.
    api_keys.revoke_key(ctx, carol, carol.key_id)
    assert may(ctx, carol, team.other, Need.WRITE)
    assert not may(ctx, carol, team.default, Need.WRITE)
    assert may(ctx, carol, team.default, Need.READ)


def test_an_ssh_key_within_a_project_opens_only_that_project(ctx: Context, team: Team) -> None:
    carol = team.carol
    assert may(ctx, carol, team.other, Need.WRITE, within_project=team.other)
    assert not may(ctx, carol, team.default, Need.WRITE, within_project=team.other)


def test_another_accounts_project_is_never_granted(
    ctx: Context, team: Team, bob: Principal
) -> None:
    assert not may(ctx, bob, team.default, Need.READ)
    with ctx.read() as s:
        # Bob's key acting "for" alice's account: he is no member there.
        assert not key_may_access(s, bob.key_id, team.owner.account_id, team.default, Need.READ)
        # A project of another account than the one named.
        assert not key_may_access(s, team.carol.key_id, bob.account_id, team.default, Need.READ)


def test_by_cluster_id(ctx: Context, team: Team) -> None:
    request = CreateCluster.model_validate({"docker_image": "img", "volume_gb": 0})
    cid = uc.create_cluster(ctx, team.owner, request).id
    carol = team.carol
    with ctx.read() as s:
        assert user_may_access_cluster(s, carol.user_id, cid, Need.WRITE)
        assert key_may_access_cluster(s, carol.key_id, carol.account_id, cid, Need.WRITE)
        assert not user_may_access_cluster(s, carol.user_id, "nosuchcluster0", Need.READ)
    assert carol.member_id is not None
    members.remove_member(ctx, team.owner, team.owner.account_id, carol.member_id)
    with ctx.read() as s:
        assert not user_may_access_cluster(s, carol.user_id, cid, Need.READ)
        assert not key_may_access_cluster(s, carol.key_id, carol.account_id, cid, Need.READ)


def test_a_key_pinned_to_a_project_its_member_loses_acts_nowhere(ctx: Context, team: Team) -> None:
    """The API's principal (services/tenancy/auth.py) and the gateway's index agree: a key
    restricted to a project acts there while its user may, and nowhere once a member
    limited to some projects loses it. A member with no project rows (every project)
    and an owner keep their pinned keys."""
    carol, owner = team.carol, team.owner
    assert carol.member_id is not None
    pinned_key = api_keys.create_key(
        ctx, carol, name="p", scope="write", restrict_to_account=False, project_id=team.other
    )["key"]
    owners_key = api_keys.create_key(
        ctx, owner, name="p", scope="write", restrict_to_account=False, project_id=team.other
    )["key"]

    def agree(key: str, acts: bool) -> None:
        who = as_key(ctx, key)
        assert who.may_use_project(team.other) is acts
        assert key_may(ctx, who, team.other, Need.WRITE) is acts
        assert not who.may_use_project(team.default)
        assert not key_may(ctx, who, team.default, Need.READ)

    agree(pinned_key, True)  # no project rows: every project
    agree(owners_key, True)
    projects.add_project_member(ctx, owner, team.other, carol.member_id)
    projects.add_project_member(ctx, owner, team.default, carol.member_id)
    agree(pinned_key, True)
    projects.remove_project_member(ctx, owner, team.other, carol.member_id)
    agree(pinned_key, False)
    assert as_key(ctx, pinned_key).project_ids == frozenset()
    agree(owners_key, True)
