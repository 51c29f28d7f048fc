"""Tenancy: accounts, their users, members, projects, API keys, invitations, quotas, SSH
keys, registry credentials, the audit trail and remembered Idempotency-Keys."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    false,
)
from sqlalchemy.orm import Mapped, mapped_column

from gpuyard.store.schema.base import Base, utcnow


class Account(Base):
    """A tenant. ``status`` active|suspended. Billing: ``billing_mode`` postpaid (with
    an optional ``monthly_budget_micro``) or prepaid (a balance: the sum of its
    ``account_credits`` less its spend since ``prepaid_since``). ``alert_percent`` of a
    budget, or a balance lasting under ``low_balance_hours`` at the current spend rate,
    raises an alert (an account event and a webhook to ``webhook_url`` signed with
    ``webhook_secret``, sealed by the installation's secret box)."""

    __tablename__ = "accounts"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    status: Mapped[str] = mapped_column(String(20), default="active", server_default="active")
    status_reason: Mapped[str | None] = mapped_column(String(500), default=None)
    status_changed_at: Mapped[datetime | None] = mapped_column(default=None)
    billing_mode: Mapped[str] = mapped_column(
        String(20), default="postpaid", server_default="postpaid"
    )
    prepaid_since: Mapped[datetime | None] = mapped_column(default=None)
    monthly_budget_micro: Mapped[int | None] = mapped_column(BigInteger, default=None)
    alert_percent: Mapped[int] = mapped_column(Integer, default=80, server_default="80")
    low_balance_hours: Mapped[float] = mapped_column(Float, default=24.0, server_default="24")
    webhook_url: Mapped[str | None] = mapped_column(String(2000), default=None)
    webhook_secret: Mapped[str | None] = mapped_column(Text, default=None)
    # Set while spending is cut off (budget or balance spent): new work answers 402.
    exhausted_at: Mapped[datetime | None] = mapped_column(default=None)


class User(Base):
    __tablename__ = "users"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    email: Mapped[str] = mapped_column(String(320), unique=True)
    name: Mapped[str] = mapped_column(String(200))
    is_admin: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Member(Base):
    __tablename__ = "members"
    __table_args__ = (UniqueConstraint("account_id", "user_id"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"))
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"))
    role: Mapped[str] = mapped_column(String(20))  # core/roles.py Role
    created_at: Mapped[datetime | None] = mapped_column(default=utcnow)


class Project(Base):
    __tablename__ = "projects"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    is_default: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class ApiKey(Base):
    __tablename__ = "api_keys"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"))
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"))
    name: Mapped[str] = mapped_column(String(200))
    prefix: Mapped[str] = mapped_column(String(20))
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    scope: Mapped[str] = mapped_column(String(10))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(default=None)
    # A key acts for any account its user is a member of (the header or active_iam
    # choose; ``account_id`` when neither does) unless restricted to ``account_id``;
    # ``project_id`` restricts it further to one project of that account.
    restricted: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    project_id: Mapped[int | None] = mapped_column(ForeignKey("projects.id"), default=None)


class ProjectMember(Base):
    """A membership's access to one project. A ``member`` or ``viewer`` with at least
    one row acts only in those projects; owners, admins and billing see every one."""

    __tablename__ = "project_members"
    __table_args__ = (UniqueConstraint("project_id", "member_id"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("projects.id"), index=True)
    member_id: Mapped[int] = mapped_column(ForeignKey("members.id"), index=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Invitation(Base):
    """A single-use invitation to join ``account_id`` as ``role``: only the token's
    SHA-256 is kept; it is accepted once, before ``expires_at``, unless revoked."""

    __tablename__ = "invitations"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"), index=True)
    email: Mapped[str] = mapped_column(String(320))
    role: Mapped[str] = mapped_column(String(20))
    # The projects the membership is given on acceptance (ProjectMember rows).
    project_ids: Mapped[list[Any]] = mapped_column(default=list)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    invited_by_user_id: Mapped[int | None] = mapped_column(ForeignKey("users.id"))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime] = mapped_column()
    accepted_at: Mapped[datetime | None] = mapped_column(default=None)
    accepted_user_id: Mapped[int | None] = mapped_column(ForeignKey("users.id"), default=None)
    revoked_at: Mapped[datetime | None] = mapped_column(default=None)


class Quota(Base):
    """One limit of an account (``project_id`` 0) or of one of its projects.
    ``resource``: gpus (``gpu_type`` '' for all types, else that type only), vcpus,
    volume_gb, snapshot_gb, running_clusters."""

    __tablename__ = "quotas"
    __table_args__ = (UniqueConstraint("account_id", "project_id", "resource", "gpu_type"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"), index=True)
    project_id: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    resource: Mapped[str] = mapped_column(String(30))
    gpu_type: Mapped[str] = mapped_column(String(100), default="", server_default="")
    limit_value: Mapped[int] = mapped_column(BigInteger)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


class AuditEvent(Base):
    """A change to an account, its memberships, keys, quotas, budget or credits: who
    (user, membership, key), what (``action`` on ``target_type``/``target_id``) and
    the request it came with."""

    __tablename__ = "audit_events"
    __table_args__ = (Index("ix_audit_events_account", "account_id", "created_at"),)
    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer(), "sqlite"), primary_key=True
    )
    account_id: Mapped[int | None] = mapped_column(Integer)
    actor_user_id: Mapped[int | None] = mapped_column(Integer)
    actor_email: Mapped[str | None] = mapped_column(String(320))
    member_id: Mapped[int | None] = mapped_column(Integer)
    key_id: Mapped[int | None] = mapped_column(Integer)
    action: Mapped[str] = mapped_column(String(64))
    target_type: Mapped[str] = mapped_column(String(40))
    target_id: Mapped[str | None] = mapped_column(String(100))
    detail: Mapped[dict[str, Any]] = mapped_column(default=dict)
    request_id: Mapped[str | None] = mapped_column(String(100))
    created_at: Mapped[datetime] = mapped_column()


class SshKey(Base):
    """A user's OpenSSH public key; training nodes authorise the keys a cluster names."""

    __tablename__ = "ssh_keys"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    public_key: Mapped[str] = mapped_column(Text)
    fingerprint: Mapped[str] = mapped_column(String(100))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # Who registered it (migration 0017): it opens a cluster only while that user may
    # write to the cluster's project (services/tenancy/cluster_access.py). None: nobody's
    # (a key stored before owners were recorded in an account without an owner).
    user_id: Mapped[int | None] = mapped_column(ForeignKey("users.id"), index=True, default=None)
    # Registered through an API key restricted to one project: it opens only that
    # project's clusters.
    project_id: Mapped[int | None] = mapped_column(ForeignKey("projects.id"), default=None)


class AccountSecret(Base):
    """A named secret of an account (RunPod's secrets), referenced from clusters' env
    as ``{{ RUNPOD_SECRET_name }}`` (core/secret_refs.py). ``value`` is sealed
    (services/tenancy/secrets.py) and never answered."""

    __tablename__ = "account_secrets"
    __table_args__ = (UniqueConstraint("account_id", "name"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"), index=True)
    name: Mapped[str] = mapped_column(String(100))
    description: Mapped[str] = mapped_column(Text, default="")
    value: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


class RegistryAuth(Base):
    """Credentials for a private container registry, used when a cluster's image is
    pulled. ``password`` is sealed with the installation's secret box
    (services/tenancy/secrets.py) and never answered."""

    __tablename__ = "registry_auths"
    # Ids are never reused (SQLite would reuse the highest after a delete): a cluster
    # naming deleted credentials never gets newer ones.
    __table_args__ = (UniqueConstraint("account_id", "name"), {"sqlite_autoincrement": True})
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    username: Mapped[str] = mapped_column(String(500))
    password: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class IdempotencyKey(Base):
    """A create request's ``Idempotency-Key``: a retry with the same key and body
    answers the resource the first request made; keys expire (``expires_at``)."""

    __tablename__ = "idempotency_keys"
    __table_args__ = (UniqueConstraint("account_id", "route", "key"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    account_id: Mapped[int] = mapped_column(Integer)
    route: Mapped[str] = mapped_column(String(100))
    key: Mapped[str] = mapped_column(String(255))
    request_hash: Mapped[str] = mapped_column(String(64))
    resource_id: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(index=True)
