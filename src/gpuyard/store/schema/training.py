"""Training clusters and their nodes."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    ForeignKey,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column

from gpuyard.store.schema.base import Base, utcnow


class TrainingCluster(Base):
    """A Slurm training cluster: one controller node and N workers (training_nodes).
    ``operation`` is the action being carried out (None when at rest); the operator
    resumes it after a crash."""

    __tablename__ = "training_clusters"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"), index=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("projects.id"), index=True)
    location: Mapped[str] = mapped_column(String(100))
    name: Mapped[str] = mapped_column(String(200))
    status: Mapped[str] = mapped_column(String(20), index=True)
    status_reason: Mapped[str] = mapped_column(Text, default="")
    error_message: Mapped[str | None] = mapped_column(Text)
    image_version_id: Mapped[int] = mapped_column(Integer)
    sku_id: Mapped[int | None] = mapped_column(Integer)
    gpu_type: Mapped[str] = mapped_column(String(100))
    gpus_per_node: Mapped[int] = mapped_column(Integer)
    cpus_per_node: Mapped[int] = mapped_column(Integer)
    memory_gb_per_node: Mapped[int] = mapped_column(Integer)
    ssh_key_ids: Mapped[list[Any]] = mapped_column(default=list)
    security_group_ids: Mapped[list[Any]] = mapped_column(default=list)
    lifecycle_script: Mapped[str | None] = mapped_column(Text)
    # A secret: never logged, never shown.
    munge_key: Mapped[str] = mapped_column(Text)
    host_id: Mapped[int | None] = mapped_column(ForeignKey("hosts.id"))
    ssh_port: Mapped[int | None] = mapped_column(Integer)
    next_worker: Mapped[int] = mapped_column(Integer, default=1)
    # Engine names of its nodes, network and state volume start with this
    # (Ownership.training_prefix); older clusters keep ``gy-tc{id}``.
    name_prefix: Mapped[str | None] = mapped_column(String(40))
    # Its nodes' IPv4 subnet, the same on every host they run on (None: a cluster made
    # before clusters spanned hosts, on an engine-chosen subnet of one host).
    subnet: Mapped[str | None] = mapped_column(String(50))
    operation: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # The auto-termination policy (core.models.TrainingAutoTerminatePolicy as stored;
    # {}: none) and when the current run began (the create or the latest start of a
    # stopped cluster; None: at its creation), which its runtime and cost count from.
    auto_terminate: Mapped[dict[str, Any]] = mapped_column(default=dict)
    run_started_at: Mapped[datetime | None] = mapped_column()
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
    deleted_at: Mapped[datetime | None] = mapped_column()
    version: Mapped[int] = mapped_column(Integer, default=1)


class TrainingNode(Base):
    """One node container of a training cluster."""

    __tablename__ = "training_nodes"
    __table_args__ = (UniqueConstraint("cluster_id", "name"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    cluster_id: Mapped[int] = mapped_column(ForeignKey("training_clusters.id"), index=True)
    role: Mapped[str] = mapped_column(String(20))
    name: Mapped[str] = mapped_column(String(100))
    status: Mapped[str] = mapped_column(String(20))
    host_id: Mapped[int | None] = mapped_column(ForeignKey("hosts.id"))
    # Its fixed IPv4 in the cluster's subnet (None: the cluster has no subnet of its own).
    address: Mapped[str | None] = mapped_column(String(50))
    gpu_indices: Mapped[list[Any]] = mapped_column(default=list)
    image_version_id: Mapped[int] = mapped_column(Integer)
    container_id: Mapped[str | None] = mapped_column(String(100))
    # The lifecycle script of the node's current container (core.training.
    # LifecycleStatus; None: the cluster has no script). The exit code once finished.
    lifecycle_status: Mapped[str | None] = mapped_column(String(20))
    lifecycle_exit_code: Mapped[int | None] = mapped_column(Integer)
    # How often the operator recreated its container after it died.
    restarts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
