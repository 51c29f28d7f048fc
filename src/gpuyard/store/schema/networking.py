"""Networking: reserved public IPs and security groups."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    ForeignKey,
    Integer,
    String,
    Text,
)
from sqlalchemy.orm import Mapped, mapped_column

from gpuyard.store.schema.base import Base, utcnow


class ReservedIp(Base):
    """An address of the admin's pool held by a project; attached to at most one
    training cluster."""

    __tablename__ = "reserved_ips"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    address: Mapped[str] = mapped_column(String(64), unique=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"), index=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("projects.id"))
    training_cluster_id: Mapped[int | None] = mapped_column(Integer, index=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class SecurityGroup(Base):
    """Inbound rules (core/network/secgroups.py); enforced for clusters that attach them."""

    __tablename__ = "security_groups"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"), index=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("projects.id"))
    name: Mapped[str] = mapped_column(String(200))
    description: Mapped[str] = mapped_column(Text, default="")
    rules: Mapped[list[Any]] = mapped_column(default=list)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
