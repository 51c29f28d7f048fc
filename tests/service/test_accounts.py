"""Accounts, memberships, invitations, keys and projects at the service level, on
SQLite and PostgreSQL: what each change stores and audits, and what it refuses."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from sqlalchemy import select

from gpuyard.core.errors import AccountSuspended, Conflict, Forbidden, ValidationFailed
from gpuyard.services.billing.admission import refuse_closed_account
from gpuyard.services.capacity.placement import lock_placement
from gpuyard.services.clock import FakeClock
from gpuyard.services.context import Context
from gpuyard.services.tenancy import accounts, api_keys, members, projects
from gpuyard.services.tenancy.auth import Principal, Scope, admin_user, resolve_key
from gpuyard.store.schema import ApiKey, AuditEvent, Member, ProjectMember, Quota


def operator(ctx: Context) -> Principal:
    from gpuyard.services.tenancy.auth import issue_key

    with ctx.transaction() as s:
        user = admin_user(s)
        account_id = s.scalar(select(Member.account_id).where(Member.user_id == user.id))
        assert account_id is not None
        key = issue_key(s, user_id=user.id, account_id=account_id, name="op", scope=Scope.ADMIN)
    with ctx.read() as s:
        return resolve_key(s, key.key)


def as_key(ctx: Context, key: str) -> Principal:
    with ctx.read() as s:
        return resolve_key(s, key)


def actions(ctx: Context, account_id: int) -> list[str]:
    with ctx.read() as s:
        return list(
            s.scalars(
                select(AuditEvent.action)
                .where(AuditEvent.account_id == account_id)
                .order_by(AuditEvent.id)
            )
        )


def test_create_account_and_owner_rules(ctx: Context, alice: Principal) -> None:
    op = operator(ctx)
    with pytest.raises(Forbidden):
        accounts.create_tenant(ctx, alice, "x", "x@y.z", None)
    with pytest.raises(ValidationFailed):
        accounts.create_tenant(ctx, op, "x", "not an email", None)
    made = accounts.create_tenant(ctx, op, "acme", "Alice@Example.com", None)
    # alice@example.com exists: she owns the new account too.
    assert made["owner"]["user_id"] == alice.user_id
    aid = made["account"]["id"]
    owner = as_key(ctx, made["api_key"]["key"])
    assert owner.account_id == aid and owner.role.value == "owner"
    assert actions(ctx, aid) == ["account.create"]

    # The last owner is neither demoted nor removed; a second owner makes both possible.
    assert owner.member_id is not None
    with pytest.raises(Conflict):
        members.change_role(ctx, owner, aid, owner.member_id, "admin")
    with pytest.raises(Conflict):
        members.remove_member(ctx, owner, aid, owner.member_id)
    inv = members.create_invitation(ctx, owner, aid, "bob@example.com", "owner", None)
    members.accept_invitation(ctx, inv.token, name=None, caller=None)
    changed = members.change_role(ctx, owner, aid, owner.member_id, "admin")
    assert changed["role"] == "admin"
    assert "member.role" in actions(ctx, aid)


def test_suspend_resume_is_audited_and_idempotent(ctx: Context) -> None:
    op = operator(ctx)
    aid = accounts.create_tenant(ctx, op, "acme", "o@acme.test", None)["account"]["id"]
    view = accounts.update_account(ctx, op, aid, name=None, status="suspended", reason="fraud")
    assert view["status"] == "suspended" and view["status_reason"] == "fraud"
    accounts.update_account(ctx, op, aid, name=None, status="suspended", reason=None)
    accounts.update_account(ctx, op, aid, name=None, status="active", reason=None)
    assert actions(ctx, aid) == ["account.create", "account.suspend", "account.resume"]


def test_invitation_expiry_and_single_use(ctx: Context, clock: FakeClock) -> None:
    op = operator(ctx)
    made = accounts.create_tenant(ctx, op, "acme", "o@acme.test", None)
    aid = made["account"]["id"]
    owner = as_key(ctx, made["api_key"]["key"])
    inv = members.create_invitation(ctx, owner, aid, "late@acme.test", "viewer", None)
    clock.advance(timedelta(days=7).total_seconds())
    with pytest.raises(members.InvitationNotFound) as exc:
        members.accept_invitation(ctx, inv.token, name=None, caller=None)
    assert exc.value.details["reason"] == "expired"
    assert members.list_invitations(ctx, aid)[0]["status"] == "expired"
    fresh = members.create_invitation(ctx, owner, aid, "late@acme.test", "viewer", None)
    got = members.accept_invitation(ctx, fresh.token, name=None, caller=None)
    assert got["api_key"] is not None
    with pytest.raises(members.InvitationNotFound):
        members.accept_invitation(ctx, fresh.token, name=None, caller=None)


def test_removing_a_member_revokes_their_keys_for_that_account(ctx: Context) -> None:
    op = operator(ctx)
    made = accounts.create_tenant(ctx, op, "acme", "o@acme.test", None)
    aid = made["account"]["id"]
    owner = as_key(ctx, made["api_key"]["key"])
    inv = members.create_invitation(ctx, owner, aid, "dev@acme.test", "member", None)
    got = members.accept_invitation(ctx, inv.token, name=None, caller=None)
    dev = as_key(ctx, got["api_key"]["key"])
    extra = api_keys.create_key(
        ctx, dev, name="laptop", scope="write", restrict_to_account=False, project_id=None
    )
    assert members.remove_member(ctx, owner, aid, got["membership"]["id"]) == 2
    with ctx.read() as s:
        live = s.scalars(
            select(ApiKey.id).where(ApiKey.user_id == dev.user_id, ApiKey.revoked_at.is_(None))
        )
        assert extra["id"] not in list(live)
    assert actions(ctx, aid)[-1] == "member.remove"


def test_a_restricted_key_makes_only_restricted_keys(ctx: Context) -> None:
    op = operator(ctx)
    made = accounts.create_tenant(ctx, op, "acme", "o@acme.test", None)
    owner = as_key(ctx, made["api_key"]["key"])
    pid = made["project"]["id"]
    narrow = api_keys.create_key(
        ctx, owner, name="ci", scope="write", restrict_to_account=False, project_id=pid
    )
    p = as_key(ctx, narrow["key"])
    child = api_keys.create_key(
        ctx, p, name="child", scope="read", restrict_to_account=False, project_id=None
    )
    assert child["restricted"] is True and child["project_id"] == pid


def test_delete_project_drops_grants_and_quotas(ctx: Context) -> None:
    op = operator(ctx)
    made = accounts.create_tenant(ctx, op, "acme", "o@acme.test", None)
    aid = made["account"]["id"]
    owner = as_key(ctx, made["api_key"]["key"])
    lab = projects.create_project(ctx, owner, None, "lab")
    assert owner.member_id is not None
    projects.add_project_member(ctx, owner, lab.id, owner.member_id)
    with ctx.transaction() as s:
        s.add(Quota(account_id=aid, project_id=lab.id, resource="gpus", limit_value=2))
    projects.delete_project(ctx, owner, lab.id)
    with ctx.read() as s:
        assert s.scalar(select(ProjectMember.id).where(ProjectMember.project_id == lab.id)) is None
        assert s.scalar(select(Quota.id).where(Quota.project_id == lab.id)) is None
    assert actions(ctx, aid)[-3:] == ["project.create", "project_member.add", "project.delete"]
    with pytest.raises(projects.ProjectNotFound):
        projects.rename_project(ctx, owner, lab.id, "again")


def test_a_suspension_waits_for_a_placement_in_flight(ctx: Context, alice: Principal) -> None:
    """A create holds the placement lock from its claim to its commit; the suspension
    takes the same lock before it lists what to stop, so it sees that create's cluster
    (or the create, checking after it, is refused): no cluster slips past it."""
    op = operator(ctx)
    done = threading.Event()

    def suspend() -> None:
        accounts.update_account(
            ctx, op, alice.account_id, name=None, status="suspended", reason=None
        )
        done.set()

    with ctx.transaction() as s:
        lock_placement(s)
        refuse_closed_account(s, alice.account_id)  # the create's admission: still open
        worker = threading.Thread(target=suspend)
        worker.start()
        assert not done.wait(1.0)  # the suspension waits for this placement to commit
    worker.join(30)
    assert done.is_set()
    with ctx.read() as s, pytest.raises(AccountSuspended):
        refuse_closed_account(s, alice.account_id)
