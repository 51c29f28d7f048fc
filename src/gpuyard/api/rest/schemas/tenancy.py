"""OpenAPI models of accounts, invitations, members, API keys, ``/v1/me``, project
members and the audit trail: request bodies and the answers' envelopes.

Like api/rest/schemas/responses.py, answers forbid unknown fields and the API tests validate real
answers against them, so the documentation cannot drift from what is sent.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, StrictBool, StrictStr, field_validator

from gpuyard.api.rest.schemas.resources import Name, Project, _envelope
from gpuyard.api.rest.schemas.responses import StrictIn, StrictOut
from gpuyard.core.input_rules import check_name
from gpuyard.services.clusters.requests import MAX_ID

RoleName = Literal["owner", "admin", "member", "billing", "viewer"]
Email = Annotated[StrictStr, Field(min_length=3, max_length=320)]
Id = Annotated[int, Field(ge=1, le=MAX_ID, strict=True)]

# -- request bodies -----------------------------------------------------------------


def _opt_name(value: str | None) -> str | None:
    return None if value is None else check_name(value)


class CreateAccount(StrictIn):
    name: Name
    owner_email: Email
    owner_name: Name | None = None

    _names = field_validator("name", "owner_name")(_opt_name)


class UpdateAccount(StrictIn):
    name: Name | None = None
    status: Literal["active", "suspended"] | None = None
    # Why the operator suspends the account (shown to its members and in its clusters'
    # events).
    reason: Annotated[StrictStr, Field(max_length=500)] | None = None

    _name = field_validator("name")(_opt_name)


class CreateInvitation(StrictIn):
    email: Email
    role: RoleName
    # The projects a member or viewer will act in (none: every project).
    project_ids: Annotated[list[Id], Field(max_length=100)] | None = None


class AcceptInvitation(StrictIn):
    # The new user's display name (default: the e-mail's local part).
    name: Name | None = None

    _name = field_validator("name")(_opt_name)


class UpdateMember(StrictIn):
    role: RoleName


class AddProjectMember(StrictIn):
    member_id: Id


class RenameProject(StrictIn):
    name: Name

    _name = field_validator("name")(check_name)


class CreateApiKey(StrictIn):
    name: Name
    scope: Literal["read", "write", "admin"] = "write"
    restrict_to_account: StrictBool = False
    project_id: Id | None = None

    _name = field_validator("name")(check_name)


# -- answers --------------------------------------------------------------------------


class Account(StrictOut):
    id: int
    name: str
    status: Literal["active", "suspended"]
    status_reason: str | None
    billing_mode: str
    created_at: str | None
    member_count: int


class AccountList(StrictOut):
    accounts: list[Account]
    page: int
    per_page: int
    total: int


class IssuedKey(StrictOut):
    """A key just made: ``key`` is shown this once."""

    id: int
    key: str
    prefix: str
    name: str
    scope: str


class Owner(StrictOut):
    user_id: int
    email: str


class AccountCreated(StrictOut):
    account: Account
    project: Project
    owner: Owner
    api_key: IssuedKey


class Invitation(StrictOut):
    id: int
    account_id: int
    email: str
    role: str
    status: Literal["pending", "accepted", "revoked", "expired"]
    created_at: str | None
    expires_at: str | None
    accepted_at: str | None


class InvitationCreated(StrictOut):
    invitation: Invitation
    # ``gyi_...``: give it to the invitee; only its hash is kept.
    token: str


class InvitationList(StrictOut):
    invitations: list[Invitation]


class Membership(StrictOut):
    id: int
    account_id: int
    role: str


class UserRef(StrictOut):
    id: int
    email: str


class InvitationAccepted(StrictOut):
    membership: Membership
    user: UserRef
    api_key: IssuedKey | None


class Member(StrictOut):
    id: int
    user_id: int
    email: str
    name: str
    role: str
    project_ids: list[int]
    created_at: str | None


class MemberList(StrictOut):
    members: list[Member]


class MemberRemoved(StrictOut):
    id: int
    deleted: bool
    keys_revoked: int


class MeUser(StrictOut):
    id: int
    email: str
    name: str


class Acting(StrictOut):
    account_id: int
    role: str | None
    member_id: int | None
    project_ids: list[int] | None


class MeMembership(StrictOut):
    id: int
    account_id: int
    account_name: str
    role: str


class Me(StrictOut):
    user: MeUser
    acting: Acting
    memberships: list[MeMembership]


class ApiKey(StrictOut):
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


class ApiKeyList(StrictOut):
    api_keys: list[ApiKey]


class ApiKeyCreated(IssuedKey):
    account_id: int
    restricted: bool
    project_id: int | None
    created_at: str | None


class ProjectMember(StrictOut):
    member_id: int
    user_id: int
    email: str
    role: str
    created_at: str | None


class ProjectMemberList(StrictOut):
    members: list[ProjectMember]


class ProjectDeleted(StrictOut):
    id: int
    deleted: bool


class Actor(StrictOut):
    user_id: int | None
    email: str | None


class Target(StrictOut):
    type: str
    id: str | None


class AuditEvent(StrictOut):
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


class AuditEventList(StrictOut):
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
