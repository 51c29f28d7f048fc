"""Roles of a membership and what each may do.

A user acts for one account at a time, through a membership with one role. What a
request may do is the intersection of its membership's role and its API key's scope
(read < write < admin). The operator (the installation's admin user with an admin key)
may do everything in every account.
"""

from __future__ import annotations

from enum import StrEnum


class Role(StrEnum):
    OWNER = "owner"
    ADMIN = "admin"
    MEMBER = "member"
    BILLING = "billing"
    VIEWER = "viewer"


class Permission(StrEnum):
    # Clusters, volumes, snapshots, templates, network resources: read them.
    READ_RESOURCES = "read_resources"
    # ... and create, change, stop or delete them.
    WRITE_RESOURCES = "write_resources"
    # Bills, balance, credits ledger, budget settings and alerts: read them.
    READ_BILLING = "read_billing"
    # Set the budget, the alert threshold and the webhook.
    MANAGE_BUDGET = "manage_budget"
    # Invite, list, change and remove members; revoke others' keys.
    MANAGE_MEMBERS = "manage_members"
    # Create, rename and delete projects; their members and quotas.
    MANAGE_PROJECTS = "manage_projects"
    # The account's audit events.
    READ_AUDIT = "read_audit"
    # Rename the account.
    MANAGE_ACCOUNT = "manage_account"
    # The caller's own API keys and SSH keys.
    OWN_KEYS = "own_keys"


_ALL = frozenset(Permission)

ROLE_PERMISSIONS: dict[Role, frozenset[Permission]] = {
    Role.OWNER: _ALL,
    Role.ADMIN: _ALL - {Permission.MANAGE_ACCOUNT},
    Role.MEMBER: frozenset(
        {Permission.READ_RESOURCES, Permission.WRITE_RESOURCES, Permission.OWN_KEYS}
    ),
    Role.BILLING: frozenset(
        {Permission.READ_BILLING, Permission.MANAGE_BUDGET, Permission.OWN_KEYS}
    ),
    Role.VIEWER: frozenset({Permission.READ_RESOURCES, Permission.OWN_KEYS}),
}

# What each permission needs of the key's scope (a read key only reads).
_READS = frozenset({Permission.READ_RESOURCES, Permission.READ_BILLING, Permission.READ_AUDIT})


# What concerns the whole account rather than one project: a key restricted to a
# project never has these, whatever its user's role (an unrestricted key of a role that
# allows them is needed). Otherwise a project's key could invite an owner, make
# projects, set other projects' quotas or read the account's audit log and bills.
ACCOUNT_LEVEL = frozenset(
    {
        Permission.MANAGE_MEMBERS,
        Permission.MANAGE_PROJECTS,
        Permission.READ_AUDIT,
        Permission.MANAGE_ACCOUNT,
        Permission.READ_BILLING,
        Permission.MANAGE_BUDGET,
    }
)


def role_allows(role: Role, permission: Permission) -> bool:
    return permission in ROLE_PERMISSIONS[role]


def needs_write_scope(permission: Permission) -> bool:
    """True when a read-scoped key may not use ``permission``."""
    return permission not in _READS


def can_grant(granter: Role, role: Role) -> bool:
    """Whether a member with role ``granter`` may give (or take away) ``role``: only an
    owner makes or unmakes owners; owners and admins manage every other role."""
    if role == Role.OWNER:
        return granter == Role.OWNER
    return granter in (Role.OWNER, Role.ADMIN)


def can_manage_keys_of(manager: Role, holder: Role) -> bool:
    """Whether a member with role ``manager`` may revoke the API keys of a member with
    role ``holder`` (their own keys aside, which every role manages): those who may
    take the holder's role away, so an admin never locks the owners out."""
    return can_grant(manager, holder)


def parse_role(value: str) -> Role:
    """The role named ``value``; ValueError naming the choices otherwise."""
    try:
        return Role(value)
    except ValueError:
        choices = ", ".join(r.value for r in Role)
        raise ValueError(f"unknown role {value!r}: one of {choices}") from None
