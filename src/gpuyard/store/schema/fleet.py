"""The fleet: hosts and their GPUs, GPU types, node images, the installation's row,
replicas' leases and the placement lock."""

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
    false,
    true,
)
from sqlalchemy.orm import Mapped, mapped_column

from gpuyard.store.schema.base import Base, utcnow


class GpuType(Base):
    __tablename__ = "gpu_types"
    id: Mapped[str] = mapped_column(String(100), primary_key=True)
    display_name: Mapped[str] = mapped_column(String(100))
    manufacturer: Mapped[str] = mapped_column(String(50))
    memory_gb: Mapped[int] = mapped_column(Integer)
    secure_price: Mapped[float] = mapped_column(Float)
    community_price: Mapped[float] = mapped_column(Float)
    secure_spot_price: Mapped[float] = mapped_column(Float)
    community_spot_price: Mapped[float] = mapped_column(Float)


class Host(Base):
    __tablename__ = "hosts"
    # Covers the placement hint's fingerprint (services/capacity/fleet_hint.py: count,
    # ids and latest updated_at of the healthy, active hosts; migration 0032).
    __table_args__ = (Index("ix_hosts_placeable", "healthy", "status", "id", "updated_at"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    location: Mapped[str] = mapped_column(String(100))
    cloud_type: Mapped[str] = mapped_column(String(20))
    address: Mapped[str] = mapped_column(String(200))
    # Where clients reach the host's published ports when not at ``address`` (a NAT's
    # outside address, a DNS name); None: at ``address``. Set by the operator.
    client_address: Mapped[str | None] = mapped_column(String(253))
    engine_url: Mapped[str | None] = mapped_column(String(500))
    vcpus: Mapped[int] = mapped_column(Integer)
    memory_gb: Mapped[int] = mapped_column(Integer)
    disk_gb: Mapped[int] = mapped_column(Integer)
    gpu_source: Mapped[str] = mapped_column(String(20))
    # The CUDA driver version ("12.4"): NVML's where it sees the GPUs, else the
    # operator's word (migration 0029); None: unknown (meets no minimum).
    cuda_version: Mapped[str | None] = mapped_column(String(16), default=None)
    # Which of vcpus/memory_gb/disk_gb were declared rather than discovered.
    declared: Mapped[list[Any]] = mapped_column(default=list)
    healthy: Mapped[bool] = mapped_column(Boolean, default=True)
    # A stable identity (GPUYARD_HOME/host-id or /etc/machine-id): a renamed machine
    # keeps its row, so its GPUs are never offered twice.
    machine_id: Mapped[str | None] = mapped_column(String(64), unique=True)
    # False when the engine cannot apply CPU/memory limits; ``limits_note`` says why.
    enforces_limits: Mapped[bool] = mapped_column(Boolean, default=True, server_default=true())
    limits_note: Mapped[str | None] = mapped_column(Text)
    # False when volume or container disk sizes are not enforced there; ``disk_note``
    # says why (runtimes/engines/engine.py Engine.disk_problem).
    enforces_disk: Mapped[bool] = mapped_column(Boolean, default=True, server_default=true())
    disk_note: Mapped[str | None] = mapped_column(Text)
    # The operator's word (core/fleet.py HostStatus): active, cordoned (no new
    # placements) or draining. Reachability is apart: ``healthy`` (placement's filter)
    # turns False after the heartbeat setting's worth of misses.
    status: Mapped[str] = mapped_column(String(20), default="active", server_default="active")
    last_heartbeat_at: Mapped[datetime | None] = mapped_column()
    unreachable_since: Mapped[datetime | None] = mapped_column()
    missed_heartbeats: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    heartbeat_error: Mapped[str | None] = mapped_column(Text)
    engine_name: Mapped[str | None] = mapped_column(String(20))
    engine_version: Mapped[str | None] = mapped_column(String(100))
    # Where a tcp:// engine's TLS client material lives (ca.pem, cert.pem, key.pem).
    engine_tls_dir: Mapped[str | None] = mapped_column(String(500))
    # The machine the server runs on (registered at start, not through the API).
    is_local: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


class Lease(Base):
    """One background duty's owner among API replicas until ``expires_at``
    (services/installation/leases.py). ``fence`` grows with every change of holder."""

    __tablename__ = "leases"
    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    holder: Mapped[str] = mapped_column(String(100))
    expires_at: Mapped[datetime] = mapped_column()
    fence: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")


class Installation(Base):
    """The one row naming this installation: its UUID labels every engine object it
    makes (core/ownership.py)."""

    __tablename__ = "installation"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    uuid: Mapped[str] = mapped_column(String(36), unique=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # When the start-up pass sealed what older versions stored in plaintext; every
    # write since seals its own secrets, so the pass (a read of every cluster row,
    # history included) runs once, not at every start.
    secrets_sealed_at: Mapped[datetime | None] = mapped_column()
    # When this installation was restored from a backup (services/installation/backup.py); None:
    # never. Volumes of ours that existed by then and the database does not know were
    # made after the backup: quarantined and kept until an admin deletes them.
    restored_at: Mapped[datetime | None] = mapped_column()


class HostGpu(Base):
    __tablename__ = "host_gpus"
    host_id: Mapped[int] = mapped_column(ForeignKey("hosts.id"), primary_key=True)
    gpu_index: Mapped[int] = mapped_column(Integer, primary_key=True)
    gpu_type: Mapped[str] = mapped_column(String(100))
    uuid: Mapped[str | None] = mapped_column(String(100))


class PlacementLock(Base):
    """A single row every placement updates first, so placements serialise on every
    backend (SQLite's write lock, PostgreSQL's row lock)."""

    __tablename__ = "placement_lock"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    counter: Mapped[int] = mapped_column(BigInteger, default=0)


class ImageVersion(Base):
    """A node image users may pick by id (``image_version_id``)."""

    __tablename__ = "image_versions"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    version: Mapped[str] = mapped_column(String(100))
    image: Mapped[str] = mapped_column(String(512), unique=True)
    description: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
