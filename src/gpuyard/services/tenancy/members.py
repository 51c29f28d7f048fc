"""Memberships of an account and the invitations that create them.

An invitation is a single-use token (``gyi_`` + url-safe random; only its SHA-256 is
kept) valid for 7 days. Accepting it creates the membership (and, for an e-mail no
user has yet, the user and their first key) in one transaction whose conditional
update of the invitation lets exactly one of concurrent accepts win.

Who may change whom: core/roles.py ``can_grant`` (only owners make or unmake
owners); an account always keeps at least one owner.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from gpuyard.core.errors import Conflict, Forbidden, NotFound, Unauthorized, ValidationFailed
from gpuyard.core.roles import Permission, Role, can_grant, parse_role
from gpuyard.services.access.resource_util import in_id_range, iso
from gpuyard.services.context import Context
from gpuyard.services.owned_rows import owned_row
from gpuyard.services.tenancy.accounts import clean_name, key_view, normalize_email
from gpuyard.services.tenancy.audit import record_audit
from gpuyard.services.tenancy.auth import Principal, Scope, issue_key
from gpuyard.store.schema import (
    Account,
    ApiKey,
    Invitation,
    Member,
    Project,
    ProjectMember,
    User,
)

INVITATION_TTL = timedelta(days=7)
MAX_INVITED_PROJECTS = 100


class InvitationNotFound(NotFound):
    """Unknown, used, revoked or expired: one code, so a token's fate is not probed;
    ``details.reason`` says which for the holder of a real token."""

    code = "INVITATION_NOT_FOUND"


class MemberNotFound(NotFound):
    code = "MEMBER_NOT_FOUND"


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def invitation_status(inv: Invitation, now: datetime) -> str:
    if inv.accepted_at is not None:
        return "accepted"
    if inv.revoked_at is not None:
        return "revoked"
    if inv.expires_at <= now:
        return "expired"
    return "pending"


def invitation_view(inv: Invitation, now: datetime) -> dict[str, Any]:
    return {
        "id": inv.id,
        "account_id": inv.account_id,
        "email": inv.email,
        "role": inv.role,
        "status": invitation_status(inv, now),
        "created_at": iso(inv.created_at),
        "expires_at": iso(inv.expires_at),
        "accepted_at": iso(inv.accepted_at),
    }


def _may_grant(principal: Principal, role: Role) -> None:
    """The operator grants anything; a member only what core/roles.py allows."""
    if principal.operator:
        return
    if not can_grant(principal.role, role):
        raise Forbidden(
            f"the role '{principal.role}' may not grant or take away '{role}'",
            {"role": principal.role.value, "target_role": role.value},
        )


def _role(value: str) -> Role:
    try:
        return parse_role(value)
    except ValueError as exc:
        raise ValidationFailed("role", str(exc)) from exc


def _account_projects(session: Session, account_id: int, project_ids: list[int]) -> list[int]:
    """``project_ids`` deduplicated, each a project of the account (else 400)."""
    wanted = sorted(set(project_ids))
    if len(wanted) > MAX_INVITED_PROJECTS:
        raise ValidationFailed("project_ids", f"at most {MAX_INVITED_PROJECTS} projects")
    if not wanted:
        return []
    if not all(in_id_range(p) for p in wanted):
        raise ValidationFailed("project_ids", "ids are 1..2147483647")
    found = set(
        session.scalars(
            select(Project.id).where(Project.account_id == account_id, Project.id.in_(wanted))
        )
    )
    missing = [p for p in wanted if p not in found]
    if missing:
        raise ValidationFailed(
            "project_ids", f"not projects of this account: {missing}", {"missing": missing}
        )
    return wanted


# -- invitations --------------------------------------------------------------------


@dataclass(frozen=True)
class NewInvitation:
    invitation: dict[str, Any]
    token: str


def create_invitation(
    ctx: Context,
    principal: Principal,
    account_id: int,
    email: str,
    role: str,
    project_ids: list[int] | None,
) -> NewInvitation:
    """Invite ``email`` to the account as ``role`` (optionally limited to projects).
    The caller has MANAGE_MEMBERS in the account. Raises ValidationFailed,
    Forbidden (a role the inviter may not grant)."""
    wanted_role = _role(role)
    _may_grant(principal, wanted_role)
    address = normalize_email(email, "email")
    now = ctx.clock.now()
    token = "gyi_" + secrets.token_urlsafe(30)
    with ctx.transaction() as session:
        projects = _account_projects(session, account_id, project_ids or [])
        inv = Invitation(
            account_id=account_id,
            email=address,
            role=wanted_role.value,
            token_hash=hash_token(token),
            invited_by_user_id=principal.user_id or None,
            created_at=now,
            expires_at=now + INVITATION_TTL,
            project_ids=projects,
        )
        session.add(inv)
        session.flush()
        record_audit(
            session,
            principal,
            account_id=account_id,
            action="invitation.create",
            target_type="invitation",
            target_id=inv.id,
            detail={"email": address, "role": wanted_role.value, "project_ids": projects},
            now=now,
        )
        return NewInvitation(invitation_view(inv, now), token)


def list_invitations(ctx: Context, account_id: int) -> list[dict[str, Any]]:
    """The account's invitations, newest first, every status."""
    now = ctx.clock.now()
    with ctx.read() as session:
        rows = session.scalars(
            select(Invitation)
            .where(Invitation.account_id == account_id)
            .order_by(Invitation.id.desc())
        )
        return [invitation_view(r, now) for r in rows]


def revoke_invitation(
    ctx: Context, principal: Principal, account_id: int, invitation_id: int
) -> dict[str, Any]:
    """Revoke a pending (or expired) invitation. Raises InvitationNotFound for an
    unknown, accepted or other account's one; revoking a revoked one is a no-op."""
    now = ctx.clock.now()
    with ctx.transaction() as session:
        inv = owned_row(
            session,
            Invitation,
            invitation_id,
            account_id,
            lambda: InvitationNotFound(
                f"invitation {invitation_id} not found", {"invitation_id": invitation_id}
            ),
            visible=lambda row: row.accepted_at is None,
        )
        if inv.revoked_at is None:
            inv.revoked_at = now
            record_audit(
                session,
                principal,
                account_id=account_id,
                action="invitation.revoke",
                target_type="invitation",
                target_id=inv.id,
                detail={"email": inv.email, "role": inv.role},
                now=now,
            )
        return invitation_view(inv, now)


def _check_acceptor(caller: Principal | None, invited: User | None, email: str) -> None:
    """Who may accept an invitation for ``email`` (``invited``: the user with that
    e-mail, if any): an existing user only with a key of their own — write scope, not
    restricted to an account or project — and a new user only without a key (the
    token holder becomes ``email``'s user: the documented flow, the inviter hands the
    token to that address). Raises Unauthorized, Forbidden."""
    if caller is None:
        if invited is not None:
            raise Unauthorized(
                f"this invitation is for an existing user: accept it with an API key of {email}"
            )
        return
    if invited is None or invited.id != caller.user_id:
        raise Forbidden("this invitation is for another e-mail address", {"field": "email"})
    caller.require(Scope.WRITE)
    if caller.key_restricted:
        raise Forbidden(
            "accepting an invitation needs a key that is not restricted to an account or project"
        )


def accept_invitation(
    ctx: Context, token: str, *, name: str | None, caller: Principal | None
) -> dict[str, Any]:
    """Accept the invitation of ``token``. Only the invited e-mail's user accepts it:
    an existing user with a key of their own (``caller``: the principal of the key the
    request carried, if any; see :func:`_check_acceptor`), else a new user with that
    e-mail is made, with a first write key for the account, shown once. Raises
    InvitationNotFound (unknown, used, revoked, expired), Unauthorized, Forbidden,
    Conflict (already a member)."""
    display = clean_name(name) if name is not None else None
    now = ctx.clock.now()
    with ctx.transaction() as session:
        inv = session.scalar(select(Invitation).where(Invitation.token_hash == hash_token(token)))
        if inv is None:
            raise InvitationNotFound("no such invitation", {"reason": "unknown"})
        status = invitation_status(inv, now)
        if status != "pending":
            raise InvitationNotFound(f"the invitation is {status}", {"reason": status})
        account = session.get(Account, inv.account_id)
        if account is None:
            raise InvitationNotFound("no such invitation", {"reason": "unknown"})
        user = session.scalar(select(User).where(User.email == inv.email))
        _check_acceptor(caller, user, inv.email)
        if user is not None and session.scalar(
            select(Member.id).where(Member.account_id == inv.account_id, Member.user_id == user.id)
        ):
            raise Conflict(
                f"{inv.email} is already a member of account {inv.account_id}",
                {"account_id": inv.account_id},
            )
        # Single use: only the transaction that flips it from pending goes on (on
        # PostgreSQL a concurrent one waits on the row, then matches nothing).
        won = session.execute(
            update(Invitation)
            .where(
                Invitation.id == inv.id,
                Invitation.accepted_at.is_(None),
                Invitation.revoked_at.is_(None),
            )
            .values(accepted_at=now)
            .execution_options(synchronize_session=False)
        )
        if getattr(won, "rowcount", 0) != 1:
            raise InvitationNotFound("the invitation is accepted", {"reason": "accepted"})
        new_user = user is None
        if user is None:
            user = User(email=inv.email, name=display or inv.email.split("@")[0], created_at=now)
            session.add(user)
            session.flush()
        session.execute(
            update(Invitation).where(Invitation.id == inv.id).values(accepted_user_id=user.id)
        )
        member = Member(account_id=inv.account_id, user_id=user.id, role=inv.role, created_at=now)
        session.add(member)
        session.flush()
        for project_id in inv.project_ids:
            if session.get(Project, project_id) is not None:
                session.add(ProjectMember(project_id=project_id, member_id=member.id))
        key = None
        if new_user:
            key = issue_key(
                session,
                user_id=user.id,
                account_id=inv.account_id,
                name="invitation",
                scope=Scope.WRITE,
            )
        actor = Principal(
            key_id=key.id if key is not None else 0,
            user_id=user.id,
            account_id=inv.account_id,
            scope=Scope.WRITE,
            default_project_id=0,
            role=Role(inv.role),
            member_id=member.id,
        )
        record_audit(
            session,
            actor,
            account_id=inv.account_id,
            action="invitation.accept",
            target_type="invitation",
            target_id=inv.id,
            detail={"email": inv.email, "role": inv.role, "member_id": member.id},
            now=now,
        )
        return {
            "membership": {"id": member.id, "account_id": inv.account_id, "role": inv.role},
            "user": {"id": user.id, "email": user.email},
            "api_key": key_view(key) if key is not None else None,
        }


# -- memberships --------------------------------------------------------------------


def _project_ids(session: Session, member_id: int) -> list[int]:
    return list(
        session.scalars(
            select(ProjectMember.project_id)
            .where(ProjectMember.member_id == member_id)
            .order_by(ProjectMember.project_id)
        )
    )


def member_view(session: Session, m: Member, user: User) -> dict[str, Any]:
    return {
        "id": m.id,
        "user_id": user.id,
        "email": user.email,
        "name": user.name,
        "role": m.role,
        "project_ids": _project_ids(session, m.id),
        "created_at": iso(m.created_at),
    }


def list_members(ctx: Context, account_id: int) -> list[dict[str, Any]]:
    """The account's members, oldest first."""
    with ctx.read() as session:
        rows = session.execute(
            select(Member, User)
            .join(User, User.id == Member.user_id)
            .where(Member.account_id == account_id)
            .order_by(Member.id)
        )
        return [member_view(session, m, u) for m, u in rows]


def load_member(session: Session, account_id: int, member_id: int) -> Member:
    """One member of ``account_id``, inside the caller's session. Raises
    MemberNotFound, also for another account's."""
    return owned_row(
        session,
        Member,
        member_id,
        account_id,
        lambda: MemberNotFound(f"member {member_id} not found", {"member_id": member_id}),
    )


def _owners(session: Session, account_id: int) -> int:
    """How many owners the account has, their rows locked (PostgreSQL) so two
    concurrent demotions cannot each leave the other as the last owner."""
    ids = session.scalars(
        select(Member.id)
        .where(Member.account_id == account_id, Member.role == Role.OWNER.value)
        .with_for_update()
    )
    return len(list(ids))


def change_role(
    ctx: Context, principal: Principal, account_id: int, member_id: int, role: str
) -> dict[str, Any]:
    """Give a member another role: the caller must be allowed to grant both the old
    and the new role; the last owner keeps theirs (409). Raises MemberNotFound,
    Forbidden, Conflict, ValidationFailed."""
    principal.require_permission(Permission.MANAGE_MEMBERS)
    new = _role(role)
    now = ctx.clock.now()
    with ctx.transaction() as session:
        member = load_member(session, account_id, member_id)
        old = Role(member.role)
        _may_grant(principal, old)
        _may_grant(principal, new)
        if old == Role.OWNER and new != Role.OWNER and _owners(session, account_id) <= 1:
            raise Conflict("the account's last owner cannot be demoted", {"member_id": member_id})
        if old != new:
            member.role = new.value
            record_audit(
                session,
                principal,
                account_id=account_id,
                action="member.role",
                target_type="member",
                target_id=member.id,
                detail={"user_id": member.user_id, "from": old.value, "to": new.value},
                now=now,
            )
        user = session.get(User, member.user_id)
        assert user is not None
        return member_view(session, member, user)


def remove_member(ctx: Context, principal: Principal, account_id: int, member_id: int) -> int:
    """Remove a membership (a member may remove themselves; otherwise MANAGE_MEMBERS
    and ``can_grant`` of their role), never the last owner. Every key of that user made
    for this account is revoked; the caller clears the principal cache. Returns the
    number of keys revoked. Raises MemberNotFound, Forbidden, Conflict."""
    now = ctx.clock.now()
    with ctx.transaction() as session:
        member = load_member(session, account_id, member_id)
        role = Role(member.role)
        if principal.member_id != member.id:
            principal.require_permission(Permission.MANAGE_MEMBERS)
            _may_grant(principal, role)
        else:
            principal.require(Scope.WRITE)  # leaving is a change: not with a read key
            # ... of the whole account: not with a key that acts in one project only.
            principal.require_unrestricted("leave the account")
        if role == Role.OWNER and _owners(session, account_id) <= 1:
            raise Conflict("the account's last owner cannot be removed", {"member_id": member_id})
        keys = list(
            session.scalars(
                select(ApiKey).where(
                    ApiKey.user_id == member.user_id,
                    ApiKey.account_id == account_id,
                    ApiKey.revoked_at.is_(None),
                )
            )
        )
        for key in keys:
            key.revoked_at = now
        session.execute(delete(ProjectMember).where(ProjectMember.member_id == member.id))
        record_audit(
            session,
            principal,
            account_id=account_id,
            action="member.remove",
            target_type="member",
            target_id=member.id,
            detail={"user_id": member.user_id, "role": role.value, "keys_revoked": len(keys)},
            now=now,
        )
        session.delete(member)
        return len(keys)


# -- the caller -----------------------------------------------------------------------


def me_view(ctx: Context, principal: Principal) -> dict[str, Any]:
    """``GET /v1/me``: the caller, the membership they act through, and all of theirs."""
    with ctx.read() as session:
        user = session.get(User, principal.user_id)
        if user is None:
            raise NotFound("user not found")
        rows = session.execute(
            select(Member, Account.name)
            .join(Account, Account.id == Member.account_id)
            .where(Member.user_id == user.id)
            .order_by(Member.id)
        )
        memberships = [
            {"id": m.id, "account_id": m.account_id, "account_name": n, "role": m.role}
            for m, n in rows
        ]
        project_ids = sorted(principal.project_ids) if principal.project_ids is not None else None
        return {
            "user": {"id": user.id, "email": user.email, "name": user.name},
            "acting": {
                "account_id": principal.account_id,
                "role": principal.role.value if principal.member_id is not None else None,
                "member_id": principal.member_id,
                "project_ids": project_ids,
            },
            "memberships": memberships,
        }
