"""Billing: credits, account events and their webhook deliveries, usage intervals and
plans."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
)
from sqlalchemy.orm import Mapped, mapped_column

from gpuyard.store.schema.base import Base, utcnow


class AccountCredit(Base):
    """A line of a prepaid account's ledger added by the operator: a top-up
    (positive) or a correction (negative), in micro-USD."""

    __tablename__ = "account_credits"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"), index=True)
    amount_micro: Mapped[int] = mapped_column(BigInteger)
    note: Mapped[str] = mapped_column(String(500), default="", server_default="")
    created_by_user_id: Mapped[int | None] = mapped_column(ForeignKey("users.id"))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class AccountEvent(Base):
    """Something that happened to an account as a whole (budget alerts, spending
    stopped, suspension), in its owners' and admins' view."""

    __tablename__ = "account_events"
    __table_args__ = (Index("ix_account_events_account", "account_id", "id"),)
    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer(), "sqlite"), primary_key=True
    )
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"))
    kind: Mapped[str] = mapped_column(String(64))
    message: Mapped[str] = mapped_column(String(1000))
    detail: Mapped[dict[str, Any]] = mapped_column(default=dict)
    # Alerts fire once per budget period: ``dedupe`` is unique when set.
    dedupe: Mapped[str | None] = mapped_column(String(200), unique=True, default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class WebhookDelivery(Base):
    """One POST of an account event to the account's webhook, retried with back-off
    until delivered or ``attempts`` reaches the limit."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (Index("ix_webhook_deliveries_due", "status", "next_attempt_at"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"), index=True)
    event_id: Mapped[int] = mapped_column(BigInteger)
    url: Mapped[str] = mapped_column(String(2000))
    body: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(20), default="pending")  # pending|delivered|failed
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime] = mapped_column()
    last_error: Mapped[str | None] = mapped_column(String(1000), default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    delivered_at: Mapped[datetime | None] = mapped_column(default=None)


class UsageInterval(Base):
    """One meter of one cluster billed at one rate (micro-USD per hour) from
    ``started_at`` to ``ended_at`` (None while open). Opened and closed only by the
    status funnel (services/clusters/lifecycle.py) and at creation; see core/billing/ledger.py."""

    __tablename__ = "usage_intervals"
    __table_args__ = (
        Index("ix_usage_intervals_cluster", "cluster_id", "started_at"),
        Index("ix_usage_intervals_project", "project_id", "started_at"),
    )
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    cluster_id: Mapped[str] = mapped_column(String(14))
    project_id: Mapped[int] = mapped_column(Integer)
    meter: Mapped[str] = mapped_column(String(20))
    gpu_type: Mapped[str | None] = mapped_column(String(100))
    rate_micro: Mapped[int] = mapped_column(BigInteger)
    started_at: Mapped[datetime] = mapped_column()
    ended_at: Mapped[datetime | None] = mapped_column()


class Plan(Base):
    """A node size with its price (``sku_id``)."""

    __tablename__ = "plans"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    gpu_type: Mapped[str] = mapped_column(String(100))
    gpus_per_node: Mapped[int] = mapped_column(Integer)
    cpus_per_node: Mapped[int] = mapped_column(Integer)
    memory_gb_per_node: Mapped[int] = mapped_column(Integer)
