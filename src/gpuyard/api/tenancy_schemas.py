"""OpenAPI models of accounts, invitations, members, API keys, ``/v1/me``, project
members and the audit trail: request bodies and the answers' envelopes.

Like api/schemas.py, answers forbid unknown fields and the API tests validate real
answers against them, so the documentation cannot drift from what is sent.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, StrictBool, StrictStr, field_validator

from gpuyard.api.resource_schemas import Name, Project, _envelope, _In, _Out
from gpuyard.core.input_rules import check_name
from gpuyard.services.requests import MAX_ID

RoleName = Literal["owner", "admin", "member", "billing", "viewer"]
Email = Annotated[StrictStr, Field(min_length=3, max_length=320)]
Id = Annotated[int, Field(ge=1, le=MAX_ID, strict=True)]

# -- request bodies -----------------------------------------------------------------


def _opt_name(value: str | None) -> str | None:
    return None if value is None else check_name(value)


class CreateAccount(_In):
    name: Name
    owner_email: Email
    owner_name: Name | None = None

    _names = field_validator("name", "owner_name")(_opt_name)


class UpdateAccount(_In):
    name: Name | None = None
    status: Literal["active", "suspended"] | None = None
    # Why the operator suspends the account (shown to its members and in its clusters'
    # events).
    reason: Annotated[StrictStr, Field(max_length=500)] | None = None

    _name = field_validator("name")(_opt_name)


class CreateInvitation(_In):
    email: Email
    role: RoleName
    # The projects a member or viewer will act in (none: every project).
    project_ids: Annotated[list[Id], Field(max_length=100)] | None = None


class AcceptInvitation(_In):
    # The new user's display name (default: the e-mail's local part).
    name: Name | None = None

    _name = field_validator("name")(_opt_name)


class UpdateMember(_In):
    role: RoleName


class AddProjectMember(_In):
    member_id: Id


class RenameProject(_In):
    name: Name

    _name = field_validator("name")(check_name)


class CreateApiKey(_In):
    name: Name
    scope: Literal["read", "write", "admin"] = "write"
    restrict_to_account: StrictBool = False
    project_id: Id | None = None

    _name = field_validator("name")(check_name)


# -- answers --------------------------------------------------------------------------


class Account(_Out):
    id: int
    name: str
    status: Literal["active", "suspended"]
    status_reason: str | None
    billing_mode: str
    created_at: str | None
    member_count: int


class AccountList(_Out):
    accounts: list[Account]
    page: int
    per_page: int
    total: int


class IssuedKey(_Out):
    """A key just made: ``key`` is shown this once."""

    id: int
    key: str
    prefix: str
    name: str
    scope: str


class Owner(_Out):
    user_id: int
    email: str


class AccountCreated(_Out):
    account: Account
    project: Project
    owner: Owner
    api_key: IssuedKey


class Invitation(_Out):
    id: int
    account_id: int
    email: str
    role: str
    status: Literal["pending", "accepted", "revoked", "expired"]
    created_at: str | None
    expires_at: str | None
    accepted_at: str | None


class InvitationCreated(_Out):
    invitation: Invitation
    # ``gyi_...``: give it to the invitee; only its hash is kept.
    token: str


class InvitationList(_Out):
    invitations: list[Invitation]


class Membership(_Out):
    id: int
    account_id: int
    role: str


class UserRef(_Out):
    id: int
    email: str


class InvitationAccepted(_Out):
    membership: Membership
    user: UserRef
    api_key: IssuedKey | None


class Member(_Out):
    id: int
    user_id: int
    email: str
    name: str
    role: str
    project_ids: list[int]
    created_at: str | None


class MemberList(_Out):
    members: list[Member]


class MemberRemoved(_Out):
    id: int
    deleted: bool
    keys_revoked: int


class MeUser(_Out):
    id: int
    email: str
    name: str


class Acting(_Out):
    account_id: int
    role: str | None
    member_id: int | None
    project_ids: list[int] | None


class MeMembership(_Out):
    id: int
    account_id: int
    account_name: str
    role: str


class Me(_Out):
    user: MeUser
    acting: Acting
    memberships: list[MeMembership]


class ApiKey(_Out):
    id: int
    name: str
    prefix: str
    scope: str
    account_id: int
    user_id: int
    user_email: str | None
    restricted: bool
    project_id: int | None
    created_at: str | None
    revoked_at: str | None


class ApiKeyList(_Out):
    api_keys: list[ApiKey]


class ApiKeyCreated(IssuedKey):
    account_id: int
    restricted: bool
    project_id: int | None
    created_at: str | None


class ProjectMember(_Out):
    member_id: int
    user_id: int
    email: str
    role: str
    created_at: str | None


class ProjectMemberList(_Out):
    members: list[ProjectMember]


class ProjectDeleted(_Out):
    id: int
    deleted: bool


class Actor(_Out):
    user_id: int | None
    email: str | None


class Target(_Out):
    type: str
    id: str | None


class AuditEvent(_Out):
    id: int
    account_id: int | None
    actor: Actor
    member_id: int | None
    key_id: int | None
    action: str
    target: Target
    detail: dict[str, Any]
    request_id: str | None
    created_at: str


class AuditEventList(_Out):
    events: list[AuditEvent]
    next_before_id: int | None


def _env(name: str, data: type[BaseModel]) -> type[BaseModel]:
    return _envelope(name, data)


AccountEnvelope = _env("AccountEnvelope", Account)
AccountListEnvelope = _env("AccountListEnvelope", AccountList)
AccountCreatedEnvelope = _env("AccountCreatedEnvelope", AccountCreated)
InvitationEnvelope = _env("InvitationEnvelope", Invitation)
InvitationCreatedEnvelope = _env("InvitationCreatedEnvelope", InvitationCreated)
InvitationListEnvelope = _env("InvitationListEnvelope", InvitationList)
InvitationAcceptedEnvelope = _env("InvitationAcceptedEnvelope", InvitationAccepted)
MemberEnvelope = _env("MemberEnvelope", Member)
MemberListEnvelope = _env("MemberListEnvelope", MemberList)
MemberRemovedEnvelope = _env("MemberRemovedEnvelope", MemberRemoved)
MeEnvelope = _env("MeEnvelope", Me)
ApiKeyEnvelope = _env("ApiKeyEnvelope", ApiKey)
ApiKeyListEnvelope = _env("ApiKeyListEnvelope", ApiKeyList)
ApiKeyCreatedEnvelope = _env("ApiKeyCreatedEnvelope", ApiKeyCreated)
ProjectMemberEnvelope = _env("ProjectMemberEnvelope", ProjectMember)
ProjectMemberListEnvelope = _env("ProjectMemberListEnvelope", ProjectMemberList)
ProjectDeletedEnvelope = _env("ProjectDeletedEnvelope", ProjectDeleted)
AuditEventListEnvelope = _env("AuditEventListEnvelope", AuditEventList)
