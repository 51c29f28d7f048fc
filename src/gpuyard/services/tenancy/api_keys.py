"""API keys managed over the API: a user's own keys in the acting account, and every
key of the account for those who manage its members.

A new key belongs to the acting account (``account_id``) and never reaches further
than the key that made it: a key restricted to the account or to a project makes only
keys restricted as much. The secret is answered once; only its SHA-256 is stored.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpuyard.core.errors import Forbidden, NotFound, ValidationFailed
from gpuyard.core.roles import Permission, Role, can_manage_keys_of
from gpuyard.services.access.resource_util import iso
from gpuyard.services.context import Context
from gpuyard.services.owned_rows import owned_row
from gpuyard.services.tenancy.accounts import clean_name, key_view
from gpuyard.services.tenancy.audit import record_audit
from gpuyard.services.tenancy.auth import Principal, Scope, issue_key
from gpuyard.services.tenancy.projects import ProjectNotFound
from gpuyard.store.schema import ApiKey, Member, Project, User


class ApiKeyNotFound(NotFound):
    code = "API_KEY_NOT_FOUND"


def api_key_view(k: ApiKey, email: str | None = None) -> dict[str, Any]:
    """A stored key, without its secret."""
    return {
        "id": k.id,
        "name": k.name,
        "prefix": k.prefix,
        "scope": k.scope,
        "account_id": k.account_id,
        "user_id": k.user_id,
        "user_email": email,
        "restricted": k.restricted,
        "project_id": k.project_id,
        "created_at": iso(k.created_at),
        "revoked_at": iso(k.revoked_at),
    }


def list_keys(ctx: Context, principal: Principal, every: bool) -> list[dict[str, Any]]:
    """The caller's live keys made for the acting account (a key restricted to a
    project: those restricted to it); ``every``: all live keys of the account (needs
    MANAGE_MEMBERS, else Forbidden). Oldest first."""
    if every:
        principal.require_permission(Permission.MANAGE_MEMBERS)
    with ctx.read() as session:
        stmt = (
            select(ApiKey, User.email)
            .join(User, User.id == ApiKey.user_id)
            .where(ApiKey.account_id == principal.account_id, ApiKey.revoked_at.is_(None))
        )
        if not every:
            stmt = stmt.where(ApiKey.user_id == principal.user_id)
            if principal.key_project_id is not None:
                stmt = stmt.where(ApiKey.project_id == principal.key_project_id)
        return [api_key_view(k, e) for k, e in session.execute(stmt.order_by(ApiKey.id))]


def _caller_key(session: Session, principal: Principal) -> ApiKey | None:
    return session.get(ApiKey, principal.key_id) if principal.key_id else None


def create_key(
    ctx: Context,
    principal: Principal,
    *,
    name: str,
    scope: str,
    restrict_to_account: bool,
    project_id: int | None,
) -> dict[str, Any]:
    """A new key of the caller for the acting account, answered once with its secret.
    ``project_id`` (a project of the acting account the caller may use) restricts it
    to that project and account. Scope admin is the operator's. Raises
    ValidationFailed, Forbidden, ProjectNotFound."""
    key_name = clean_name(name)
    try:
        wanted = Scope(scope)
    except ValueError as exc:
        raise ValidationFailed("scope", "must be read, write or admin") from exc
    if wanted == Scope.ADMIN:
        principal.require(Scope.ADMIN)
    now = ctx.clock.now()
    with ctx.transaction() as session:
        caller = _caller_key(session, principal)
        restricted = restrict_to_account or project_id is not None
        if caller is not None and caller.project_id is not None:
            if project_id is not None and project_id != caller.project_id:
                raise Forbidden(f"this API key is restricted to project {caller.project_id}")
            project_id = caller.project_id
        if caller is not None and caller.restricted:
            restricted = True
        if project_id is not None:
            asked = project_id
            owned_row(
                session,
                Project,
                asked,
                principal.account_id,
                lambda: ProjectNotFound(f"project {asked} not found", {"project_id": asked}),
                visible=lambda row: principal.may_use_project(row.id),
            )
        issued = issue_key(
            session,
            user_id=principal.user_id,
            account_id=principal.account_id,
            name=key_name,
            scope=wanted,
        )
        row = session.get(ApiKey, issued.id)
        assert row is not None
        row.restricted = restricted
        row.project_id = project_id
        row.created_at = now
        record_audit(
            session,
            principal,
            account_id=principal.account_id,
            action="key.create",
            target_type="api_key",
            target_id=issued.id,
            detail={
                "name": key_name,
                "scope": wanted.value,
                "prefix": issued.prefix,
                "restricted": restricted,
                "project_id": project_id,
            },
            now=now,
        )
        return {
            **key_view(issued),
            "account_id": principal.account_id,
            "restricted": restricted,
            "project_id": project_id,
            "created_at": iso(now),
        }


def _own(principal: Principal, key: ApiKey) -> bool:
    """A key of the caller's own that the caller's key reaches: any of the user's, or
    for a key restricted to a project, those restricted to the same project."""
    if key.user_id != principal.user_id:
        return False
    return principal.key_project_id is None or key.project_id == principal.key_project_id


def _holder_role(session: Session, key: ApiKey) -> Role:
    """The role of the key's user in the key's account. A user with no membership
    there (the operator's key made while acting in the account) counts as an owner:
    only owners and the operator manage such a key."""
    role = session.scalar(
        select(Member.role).where(
            Member.account_id == key.account_id, Member.user_id == key.user_id
        )
    )
    return Role(role) if role is not None else Role.OWNER


def _may_revoke(session: Session, principal: Principal, key: ApiKey) -> None:
    """Another user's key: only a role that may take its holder's role away (an admin
    never revokes an owner's key: core/roles.py ``can_manage_keys_of``). Raises
    Forbidden naming both roles."""
    if key.user_id == principal.user_id or principal.operator:
        return
    holder = _holder_role(session, key)
    if not can_manage_keys_of(principal.role, holder):
        raise Forbidden(
            f"the role '{principal.role}' may not revoke the keys of '{holder}' members",
            {"role": principal.role.value, "target_role": holder.value, "key_id": key.id},
        )


def revoke_key(ctx: Context, principal: Principal, key_id: int) -> dict[str, Any]:
    """Revoke a key of the acting account: the caller's own, or another user's with
    MANAGE_MEMBERS and a role that may take that user's role away (only owners revoke
    owners' keys). Revoking a revoked key changes nothing. Raises ApiKeyNotFound
    (another account's key, another user's without MANAGE_MEMBERS — a key restricted
    to a project has it never — or, for such a key, one of its user's keys not
    restricted to the same project), Forbidden (a holder the caller's role may
    not manage)."""
    now = ctx.clock.now()
    with ctx.transaction() as session:
        row = owned_row(
            session,
            ApiKey,
            key_id,
            principal.account_id,
            lambda: ApiKeyNotFound(f"API key {key_id} not found", {"key_id": key_id}),
            visible=lambda key: _own(principal, key) or principal.allows(Permission.MANAGE_MEMBERS),
        )
        _may_revoke(session, principal, row)
        if row.revoked_at is None:
            row.revoked_at = now
            record_audit(
                session,
                principal,
                account_id=row.account_id,
                action="key.revoke",
                target_type="api_key",
                target_id=row.id,
                detail={"name": row.name, "prefix": row.prefix, "user_id": row.user_id},
                now=now,
            )
        email = session.scalar(select(User.email).where(User.id == row.user_id))
        return api_key_view(row, email)
