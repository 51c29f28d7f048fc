"""Volumes: network volumes, snapshots, volume moves and restores, orphaned volumes."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    BigInteger,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column

from gpuyard.store.schema.base import Base, utcnow


class VolumeMove(Base):
    """A cluster's volume being copied to another host (resume elsewhere, drain). The
    source host's disk stays counted (services/fleet/hosts.py capacities) until it ends."""

    __tablename__ = "volume_moves"
    cluster_id: Mapped[str] = mapped_column(String(14), primary_key=True)
    from_host_id: Mapped[int] = mapped_column(ForeignKey("hosts.id"), index=True)
    to_host_id: Mapped[int] = mapped_column(ForeignKey("hosts.id"))
    volume_gb: Mapped[int] = mapped_column(Integer)
    # The engine volume on the source host (the target gets the installation's name).
    source_volume: Mapped[str] = mapped_column(String(255))
    reason: Mapped[str] = mapped_column(Text)
    # copying, copied (the old copy is deleted once the cluster runs), failed
    status: Mapped[str] = mapped_column(String(20))
    bytes_copied: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    seconds: Mapped[float | None] = mapped_column(Float)
    error: Mapped[str | None] = mapped_column(Text)
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column()


class NetworkVolume(Base):
    """Storage that outlives clusters (RunPod's network volume): an engine volume on one
    host, mounted by any number of the project's clusters on that host. Its disk is
    held by a ``reservations`` row whose holder is the volume's id."""

    __tablename__ = "network_volumes"
    id: Mapped[str] = mapped_column(String(14), primary_key=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"), index=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("projects.id"))
    name: Mapped[str] = mapped_column(String(200))
    size_gb: Mapped[int] = mapped_column(Integer)
    # No foreign key: a deleted volume's row is history and must not keep its host from
    # being deleted (a live one holds a reservation, which does).
    host_id: Mapped[int] = mapped_column(Integer, index=True)
    # The data centre (the host's location) it lives in: RunPod's dataCenterId.
    location: Mapped[str] = mapped_column(String(100))
    # The engine volume; changes when a restore swaps in a restored copy.
    volume_name: Mapped[str] = mapped_column(String(255))
    used_bytes: Mapped[int | None] = mapped_column(BigInteger)
    measured_at: Mapped[datetime | None] = mapped_column()
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
    # Set when deleted; the row stays for billing history.
    deleted_at: Mapped[datetime | None] = mapped_column()
    version: Mapped[int] = mapped_column(Integer, default=1)


class Snapshot(Base):
    """A saved copy of a cluster's or a network volume's data, kept in its account's
    restic repository (storage/account_repositories.py), as the volume's files or one
    tar file (``format``), tagged with the snapshot's id."""

    __tablename__ = "snapshots"
    __table_args__ = (Index("ix_snapshots_account_created", "account_id", "created_at"),)
    id: Mapped[str] = mapped_column(String(14), primary_key=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"))
    project_id: Mapped[int] = mapped_column(ForeignKey("projects.id"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    description: Mapped[str] = mapped_column(Text, default="")
    source_cluster_id: Mapped[str | None] = mapped_column(String(14), index=True)
    source_network_volume_id: Mapped[str | None] = mapped_column(String(14), index=True)
    # Where the data was read from: the host and its engine volume at request time (no
    # foreign key: a snapshot outlives the host it was read from).
    host_id: Mapped[int] = mapped_column(Integer)
    volume_name: Mapped[str] = mapped_column(String(255))
    # The source volume's size in GB (a clone needs at least this much).
    volume_gb: Mapped[int] = mapped_column(Integer)
    # creating, ready, failed (core/snapshots.py SnapshotStatus)
    status: Mapped[str] = mapped_column(String(20), index=True)
    # stopped or crash_consistent (taken while the source was mounted by a running
    # container)
    consistency: Mapped[str] = mapped_column(String(20))
    error: Mapped[str | None] = mapped_column(Text)
    size_bytes: Mapped[int | None] = mapped_column(BigInteger)
    stored_bytes: Mapped[int | None] = mapped_column(BigInteger)
    file_count: Mapped[int | None] = mapped_column(Integer)
    bytes_done: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    restic_id: Mapped[str | None] = mapped_column(String(64))
    # How the data is kept (core/snapshots.py SnapshotFormat): ``tar``, one file
    # volume.tar (taken where restic cannot run beside the volume); ``tree``, the
    # volume's files under /data (restic beside the volume, reaching the repository
    # only through the operation's REST backend server).
    format: Mapped[str] = mapped_column(String(10), default="tar", server_default="tar")
    # Which repository holds the data (core/snapshots.py SnapshotRepository):
    # ``account``, the account's own; NULL, the installation-wide one of earlier
    # versions, whose snapshots are moved into their accounts' at start-up.
    repository: Mapped[str | None] = mapped_column(String(10))
    # Which replica works on it and when it last said so: a ``creating`` snapshot
    # whose worker went silent (a crash) is failed by the maintenance duty.
    worker: Mapped[str | None] = mapped_column(String(100))
    heartbeat_at: Mapped[datetime | None] = mapped_column()
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    ready_at: Mapped[datetime | None] = mapped_column()
    # Set when deleted (its data forgotten in the repository); kept for billing.
    deleted_at: Mapped[datetime | None] = mapped_column()


class VolumeRestore(Base):
    """A snapshot being restored into a cluster's (or network volume's) volume: the
    data goes into ``target_volume``, a new engine volume, which replaces the old one
    only once it is whole, so a failed restore leaves the volume as it was."""

    __tablename__ = "volume_restores"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    # The holder whose volume is restored: a cluster id or a network volume id.
    holder_id: Mapped[str] = mapped_column(String(14), index=True)
    snapshot_id: Mapped[str] = mapped_column(String(14))
    # A snapshot of the volume taken first (``snapshot_before_changes``): the restore
    # waits for it and is called off if it fails.
    after_snapshot_id: Mapped[str | None] = mapped_column(String(14))
    host_id: Mapped[int] = mapped_column(Integer)  # history: no foreign key
    target_volume: Mapped[str] = mapped_column(String(255))
    # restoring, done, failed
    status: Mapped[str] = mapped_column(String(20))
    bytes_done: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    total_bytes: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    error: Mapped[str | None] = mapped_column(Text)
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column()


class OrphanVolume(Base):
    """A volume of ours the database does not know: kept (quarantined), never deleted
    on sight, so a database restored from an older backup loses no tenant data.
    Deleted after ``delete_after`` (None: kept until an admin deletes it) or by an
    admin."""

    __tablename__ = "orphan_volumes"
    __table_args__ = (UniqueConstraint("host_id", "name"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    host_id: Mapped[int] = mapped_column(Integer)
    name: Mapped[str] = mapped_column(String(255))
    cluster_id: Mapped[str | None] = mapped_column(String(64))
    size_bytes: Mapped[int | None] = mapped_column(BigInteger)
    found_at: Mapped[datetime] = mapped_column(default=utcnow)
    delete_after: Mapped[datetime | None] = mapped_column()
    # None while quarantined; when deleted (or found known again: ``released``).
    deleted_at: Mapped[datetime | None] = mapped_column()
    outcome: Mapped[str | None] = mapped_column(String(20))
