"""The SSH-key use cases (``/v1/ssh-keys``, GraphQL's ``pubKey``): each opens its own
transaction and checks what the caller may do.

A key belongs to the acting account and to the user who adds it (and to its API
key's project, when that key is restricted to one). Who sees a key: a key restricted
to a project only that project's keys; a caller acting in every project all of the
account's; anyone else their own user's keys and those of their projects. The key
itself (parsing, fingerprints, the gateway's reads) is services/access/ssh_keys.py's.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpuyard.core.errors import Forbidden
from gpuyard.core.roles import Permission, Role, can_manage_keys_of
from gpuyard.services.access.ssh_keys import (
    SshKeyNotFound,
    account_public_keys,
    add_key,
    registering_project,
    replace_keys_from_text,
)
from gpuyard.services.context import Context
from gpuyard.services.owned_rows import owned_row
from gpuyard.services.tenancy.auth import Principal
from gpuyard.services.tenancy.projects import acting_account
from gpuyard.store.schema import Member, SshKey


def _visible(row: SshKey, principal: Principal) -> bool:
    """Whether ``principal`` sees ``row`` of its account (see the module docstring)."""
    if principal.key_project_id is not None:
        return row.project_id == principal.key_project_id
    if principal.project_ids is None:
        return True
    return row.user_id == principal.user_id or (
        row.project_id is not None and row.project_id in principal.project_ids
    )


def _find(session: Session, principal: Principal, account_id: int, key_id: int) -> SshKey:
    """One key of ``account_id`` that ``principal`` sees. Raises SshKeyNotFound (also
    for another account's, or one it does not see)."""
    return owned_row(
        session,
        SshKey,
        key_id,
        account_id,
        lambda: SshKeyNotFound(f"SSH key {key_id} not found", {"ssh_key_id": key_id}),
        visible=lambda row: _visible(row, principal),
    )


def list_ssh_keys(ctx: Context, principal: Principal, active_iam: int | None) -> list[SshKey]:
    """The acting account's keys that ``principal`` sees, oldest first. Raises
    ValidationFailed / Forbidden for an ``active_iam`` it may not act as."""
    with ctx.read() as session:
        account_id = acting_account(session, principal, active_iam)
        rows = session.scalars(
            select(SshKey).where(SshKey.account_id == account_id).order_by(SshKey.id)
        )
        return [r for r in rows if _visible(r, principal)]


def show_ssh_key(ctx: Context, principal: Principal, active_iam: int | None, key_id: int) -> SshKey:
    """One key of the acting account that ``principal`` sees. Raises SshKeyNotFound,
    ValidationFailed / Forbidden (``active_iam``)."""
    with ctx.read() as session:
        return _find(session, principal, acting_account(session, principal, active_iam), key_id)


def add_ssh_key(
    ctx: Context, principal: Principal, active_iam: int | None, name: object, public_key: object
) -> SshKey:
    """Store a validated key in the acting account, owned by the caller's user and
    limited to its API key's project (when restricted to one). Needs the write
    permission. Raises Forbidden, ValidationFailed("name" | "public_key")."""
    principal.require_write()
    with ctx.transaction() as session:
        return add_key(
            session,
            acting_account(session, principal, active_iam),
            name,
            public_key,
            user_id=principal.user_id,
            project_id=registering_project(session, principal),
        )


def delete_ssh_key(ctx: Context, principal: Principal, active_iam: int | None, key_id: int) -> None:
    """Delete one key: the caller's own, or anyone's it sees with ``manage_members``
    and a role that may manage the keys of its user's role (an admin never removes an
    owner's: core/roles.py ``can_manage_keys_of``). Needs the write permission. The
    gateway and the clusters' sshd stop taking it within seconds; training clusters
    that already authorised it keep it until their keys are next updated (their
    nodes hold copies, not references). Raises Forbidden, SshKeyNotFound."""
    principal.require_write()
    with ctx.transaction() as session:
        account_id = acting_account(session, principal, active_iam)
        row = _find(session, principal, account_id, key_id)
        if row.user_id != principal.user_id:
            principal.require_permission(Permission.MANAGE_MEMBERS)
            _require_may_manage(session, principal, row)
        session.delete(row)
        session.flush()


def own_public_keys(ctx: Context, principal: Principal) -> str:
    """The caller's keys in its account as ``authorized_keys`` text (RunPod's
    ``myself { pubKey }``; a key restricted to a project: the caller's keys of that
    project, the ones ``replace_own_keys`` replaces). Empty when there are none."""
    with ctx.read() as session:
        return account_public_keys(
            session,
            principal.account_id,
            user_id=principal.user_id,
            key_project_id=principal.key_project_id,
        )


def replace_own_keys(ctx: Context, principal: Principal, text: object) -> list[SshKey]:
    """Make the caller's keys in its account exactly those of ``text`` (RunPod's
    ``pubKey``: see ssh_keys.replace_keys_from_text); other members' keys stay. Needs
    the write permission: the account's keys log into every cluster of it. Raises
    Forbidden, ValidationFailed("pubKey")."""
    principal.require_write()
    with ctx.transaction() as session:
        return replace_keys_from_text(
            session,
            principal.account_id,
            text,
            user_id=principal.user_id,
            project_id=registering_project(session, principal),
        )


def _holder_role(session: Session, row: SshKey) -> Role | None:
    """The role of the key's user in the key's account; None for a key of nobody.
    A user with no membership there (the operator, or a member since removed)
    counts as an owner, as services/tenancy/api_keys.py decides for API keys."""
    if row.user_id is None:
        return None
    role = session.scalar(
        select(Member.role).where(
            Member.account_id == row.account_id, Member.user_id == row.user_id
        )
    )
    return Role(role) if role is not None else Role.OWNER


def _require_may_manage(session: Session, principal: Principal, row: SshKey) -> None:
    """Another user's key: only a role that may take its holder's role away. Raises
    Forbidden naming both roles."""
    if principal.operator:
        return
    holder = _holder_role(session, row)
    if holder is not None and not can_manage_keys_of(principal.role, holder):
        raise Forbidden(
            f"the role '{principal.role}' may not remove the SSH keys of '{holder}' members",
            {"role": principal.role.value, "target_role": holder.value, "ssh_key_id": row.id},
        )
