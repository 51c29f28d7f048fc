"""Roles and permissions (core/roles.py) and how a principal combines them with its
key's scope (services/tenancy/auth.py)."""

from __future__ import annotations

import pytest

from gpuyard.core.errors import Forbidden
from gpuyard.core.roles import (
    ACCOUNT_LEVEL,
    ROLE_PERMISSIONS,
    Permission,
    Role,
    can_grant,
    can_manage_keys_of,
    needs_write_scope,
    parse_role,
    role_allows,
)
from gpuyard.services.tenancy.auth import Principal, Scope


def principal(role: Role, scope: Scope = Scope.WRITE, operator: bool = False) -> Principal:
    return Principal(
        key_id=1,
        user_id=1,
        account_id=1,
        scope=scope,
        default_project_id=1,
        role=role,
        member_id=None if operator else 1,
        operator=operator,
    )


def test_role_table() -> None:
    assert ROLE_PERMISSIONS[Role.OWNER] == frozenset(Permission)
    assert Permission.MANAGE_ACCOUNT not in ROLE_PERMISSIONS[Role.ADMIN]
    assert role_allows(Role.ADMIN, Permission.MANAGE_MEMBERS)
    assert role_allows(Role.MEMBER, Permission.WRITE_RESOURCES)
    assert not role_allows(Role.MEMBER, Permission.READ_BILLING)
    assert role_allows(Role.BILLING, Permission.MANAGE_BUDGET)
    assert not role_allows(Role.BILLING, Permission.READ_RESOURCES)
    assert role_allows(Role.VIEWER, Permission.READ_RESOURCES)
    assert not role_allows(Role.VIEWER, Permission.WRITE_RESOURCES)
    for role in Role:
        assert role_allows(role, Permission.OWN_KEYS)
    # Only owners and admins read the audit trail.
    assert {r for r in Role if role_allows(r, Permission.READ_AUDIT)} == {Role.OWNER, Role.ADMIN}


@pytest.mark.parametrize(
    ("granter", "role", "allowed"),
    [
        (Role.OWNER, Role.OWNER, True),
        (Role.OWNER, Role.VIEWER, True),
        (Role.ADMIN, Role.OWNER, False),
        (Role.ADMIN, Role.ADMIN, True),
        (Role.ADMIN, Role.BILLING, True),
        (Role.MEMBER, Role.VIEWER, False),
        (Role.BILLING, Role.MEMBER, False),
        (Role.VIEWER, Role.VIEWER, False),
    ],
)
def test_can_grant(granter: Role, role: Role, allowed: bool) -> None:
    assert can_grant(granter, role) is allowed


def test_parse_role_names_the_choices() -> None:
    assert parse_role("billing") is Role.BILLING
    with pytest.raises(ValueError, match="owner, admin, member, billing, viewer"):
        parse_role("root")


def test_scope_and_role_both_count() -> None:
    assert needs_write_scope(Permission.MANAGE_MEMBERS)
    assert not needs_write_scope(Permission.READ_AUDIT)
    reader = principal(Role.OWNER, Scope.READ)
    assert reader.allows(Permission.READ_AUDIT)
    assert not reader.allows(Permission.WRITE_RESOURCES)
    with pytest.raises(Forbidden, match="scope 'read'"):
        reader.require_permission(Permission.MANAGE_PROJECTS)
    viewer = principal(Role.VIEWER)
    with pytest.raises(Forbidden) as exc:
        viewer.require_write()
    assert exc.value.details == {"role": "viewer", "permission": "write_resources"}
    # The operator may do everything, within its key's scope.
    op = principal(Role.VIEWER, Scope.ADMIN, operator=True)
    assert all(op.allows(p) for p in Permission)
    op.require(Scope.ADMIN)
    with pytest.raises(Forbidden):
        principal(Role.OWNER, Scope.ADMIN).require(Scope.ADMIN)  # an admin key, no operator


def test_a_key_restricted_to_a_project_has_no_account_level_permission() -> None:
    for operator in (False, True):
        owner = Principal(
            key_id=1,
            user_id=1,
            account_id=1,
            scope=Scope.WRITE,
            default_project_id=7,
            project_ids=frozenset({7}),
            operator=operator,
            key_project_id=7,
            key_restricted=True,
        )
        for permission in Permission:
            assert owner.allows(permission) == (permission not in ACCOUNT_LEVEL)
        with pytest.raises(Forbidden) as refused:
            owner.require_permission(Permission.MANAGE_MEMBERS)
        assert refused.value.details["restricted_to_project"] == 7
        assert refused.value.details["permission"] == "manage_members"
        owner.require_permission(Permission.WRITE_RESOURCES)
        owner.require_permission(Permission.OWN_KEYS)


def test_who_manages_whose_keys() -> None:
    assert all(can_manage_keys_of(Role.OWNER, holder) for holder in Role)
    assert not can_manage_keys_of(Role.ADMIN, Role.OWNER)
    assert all(can_manage_keys_of(Role.ADMIN, h) for h in Role if h != Role.OWNER)
    for manager in (Role.MEMBER, Role.BILLING, Role.VIEWER):
        assert not any(can_manage_keys_of(manager, holder) for holder in Role)
