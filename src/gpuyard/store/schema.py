"""The tables. Capacity claims are rows with unique keys so the database, not Python,
decides who gets the last GPU or port (DESIGN.md rule 3)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    false,
    text,
    true,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class UtcDateTime(TypeDecorator[datetime]):
    """Stores naive UTC, returns aware UTC on every backend."""

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is not None:
            value = value.astimezone(UTC).replace(tzinfo=None)
        return value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        return None if value is None else value.replace(tzinfo=UTC)


def utcnow() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    type_annotation_map = {datetime: UtcDateTime(), dict[str, Any]: JSON, list[Any]: JSON}


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
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    location: Mapped[str] = mapped_column(String(100))
    cloud_type: Mapped[str] = mapped_column(String(20))
    address: Mapped[str] = mapped_column(String(200))
    engine_url: Mapped[str | None] = mapped_column(String(500))
    vcpus: Mapped[int] = mapped_column(Integer)
    memory_gb: Mapped[int] = mapped_column(Integer)
    disk_gb: Mapped[int] = mapped_column(Integer)
    gpu_source: Mapped[str] = mapped_column(String(20))
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
    # says why (runtimes/engine.py Engine.disk_problem).
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


class VolumeMove(Base):
    """A cluster's volume being copied to another host (resume elsewhere, drain). The
    source host's disk stays counted (services/hosts.py capacities) until it ends."""

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
    restic repository (storage/account_repositories.py) as one tar file tagged with
    the snapshot's id."""

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
    # volume.tar (every snapshot taken now); ``tree``, the volume's files under /data
    # (taken by earlier versions with restic beside the volume; still restored).
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


class Lease(Base):
    """One background duty's owner among API replicas until ``expires_at``
    (services/leases.py). ``fence`` grows with every change of holder."""

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
    # When this installation was restored from a backup (services/backup.py); None:
    # never. Volumes of ours that existed by then and the database does not know were
    # made after the backup: quarantined and kept until an admin deletes them.
    restored_at: Mapped[datetime | None] = mapped_column()


class HostGpu(Base):
    __tablename__ = "host_gpus"
    host_id: Mapped[int] = mapped_column(ForeignKey("hosts.id"), primary_key=True)
    gpu_index: Mapped[int] = mapped_column(Integer, primary_key=True)
    gpu_type: Mapped[str] = mapped_column(String(100))
    uuid: Mapped[str | None] = mapped_column(String(100))


class Cluster(Base):
    __tablename__ = "clusters"
    __table_args__ = (
        Index("ix_clusters_project_status", "project_id", "status"),
        # The list's keyset order (newest first, id breaking ties) within a project.
        Index("ix_clusters_project_created", "project_id", "created_at", "id"),
        # The default (live) list's pages and count never touch terminated clusters;
        # services/cluster_lists.py repeats the predicate word for word (migration 0012).
        Index(
            "ix_clusters_live_created",
            "project_id",
            "created_at",
            "id",
            sqlite_where=text("status != 'terminated'"),
            postgresql_where=text("status != 'terminated'"),
        ),
        Index("ix_clusters_project_status_created", "project_id", "status", "created_at", "id"),
        # The clusters live on a host (heartbeats, the observe pass), by status: an IN
        # list of live statuses never walks the host's terminated ones (migration 0015).
        Index("ix_clusters_host_status", "host_id", "status"),
    )
    id: Mapped[str] = mapped_column(String(14), primary_key=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("projects.id"))
    name: Mapped[str] = mapped_column(String(200))
    image: Mapped[str] = mapped_column(String(512))
    docker_args: Mapped[str] = mapped_column(Text, default="")
    env: Mapped[dict[str, Any]] = mapped_column(default=dict)
    ports: Mapped[list[Any]] = mapped_column(default=list)
    gpu_type: Mapped[str | None] = mapped_column(String(100))
    gpu_count: Mapped[int] = mapped_column(Integer, default=0)
    cpu_cores: Mapped[int] = mapped_column(Integer)
    memory_gb: Mapped[int] = mapped_column(Integer)
    container_disk_gb: Mapped[int] = mapped_column(Integer)
    volume_gb: Mapped[int] = mapped_column(Integer)
    volume_mount_path: Mapped[str] = mapped_column(String(512))
    cloud_type: Mapped[str] = mapped_column(String(20))
    # Spot: an interruptible cluster pays its bid and may be preempted by a higher one.
    interruptible: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    bid_per_gpu: Mapped[float | None] = mapped_column(Float)
    auto_terminate: Mapped[dict[str, Any]] = mapped_column(default=dict)
    desired_status: Mapped[str] = mapped_column(String(20))
    status: Mapped[str] = mapped_column(String(20), index=True)
    status_reason: Mapped[str] = mapped_column(Text, default="")
    error_message: Mapped[str | None] = mapped_column(Text)
    startup_step: Mapped[int] = mapped_column(Integer, default=0)
    host_id: Mapped[int | None] = mapped_column(ForeignKey("hosts.id"))
    gpu_indices: Mapped[list[Any]] = mapped_column(default=list)
    runtime_handle: Mapped[dict[str, Any]] = mapped_column(default=dict)
    # The engine volume; None: the installation's name for it (Ownership.volume). Set
    # for clusters older than installation ids, whose volume keeps its first name.
    volume_name: Mapped[str | None] = mapped_column(String(255))
    # A network volume mounted at volume_mount_path in place of the cluster's own
    # volume (which is then never made); None: the cluster's own volume.
    network_volume_id: Mapped[str | None] = mapped_column(String(14), index=True)
    # The volume's used bytes as last measured by the engine (None: not yet).
    volume_used_bytes: Mapped[int | None] = mapped_column(BigInteger)
    volume_measured_at: Mapped[datetime | None] = mapped_column()
    # Desired state wins: how often the container was brought back, the last exit
    # code seen, and the failure times within the restart window (ISO strings).
    restarts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    last_exit_code: Mapped[int | None] = mapped_column(Integer)
    # A start requested while the cluster was stopping (its body as JSON, sealed by the
    # secret box: it may carry env values); the reconciler applies it once the stop is
    # done. Set only while desired_status is running and status is stopping or stopped.
    pending_start: Mapped[str | None] = mapped_column(Text)
    last_restart_at: Mapped[datetime | None] = mapped_column()
    next_restart_at: Mapped[datetime | None] = mapped_column()
    recent_failures: Mapped[list[Any]] = mapped_column(default=list)
    start_initiated_at: Mapped[datetime | None] = mapped_column()
    started_at: Mapped[datetime | None] = mapped_column()
    stopped_at: Mapped[datetime | None] = mapped_column()
    terminated_at: Mapped[datetime | None] = mapped_column()
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
    version: Mapped[int] = mapped_column(Integer, default=1)
    # The usage ledger's running totals (services/ledger_totals.py keeps them with the
    # intervals): amounts of closed intervals in micro-USD*s/h, over the lifetime and
    # since ``billed_run_from`` (the current run's start, to the second), and the rate
    # of the open intervals (all opened at ``open_since``). A cluster's cost is these
    # plus the open interval, never a re-read of its whole history.
    billed_closed: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    billed_run_closed: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    billed_run_from: Mapped[datetime | None] = mapped_column()
    open_rate_micro: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    open_since: Mapped[datetime | None] = mapped_column()


class GpuAllocation(Base):
    """One claimed GPU. The primary key makes a double allocation impossible."""

    __tablename__ = "gpu_allocations"
    host_id: Mapped[int] = mapped_column(ForeignKey("hosts.id"), primary_key=True)
    gpu_index: Mapped[int] = mapped_column(Integer, primary_key=True)
    # The holder: a cluster id, or a training node's owner id (core/training.py).
    cluster_id: Mapped[str] = mapped_column(String(14), index=True)


class Reservation(Base):
    """vCPU/memory/disk a cluster holds on its host. Compute drops to zero on stop;
    the volume stays reserved until terminate."""

    __tablename__ = "reservations"
    # The holder: a cluster id, or a training node's owner id (core/training.py).
    cluster_id: Mapped[str] = mapped_column(String(14), primary_key=True)
    host_id: Mapped[int] = mapped_column(ForeignKey("hosts.id"), index=True)
    vcpus: Mapped[int] = mapped_column(Integer)
    memory_gb: Mapped[int] = mapped_column(Integer)
    container_disk_gb: Mapped[int] = mapped_column(Integer)
    volume_gb: Mapped[int] = mapped_column(Integer)


class PortAllocation(Base):
    __tablename__ = "port_allocations"
    host_id: Mapped[int] = mapped_column(ForeignKey("hosts.id"), primary_key=True)
    port: Mapped[int] = mapped_column(Integer, primary_key=True)
    protocol: Mapped[str] = mapped_column(String(4), primary_key=True)
    # The holder: a cluster id, or a training cluster's owner id (core/training.py).
    cluster_id: Mapped[str] = mapped_column(String(14), index=True)
    internal_port: Mapped[int] = mapped_column(Integer)


class Event(Base):
    __tablename__ = "events"
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    cluster_id: Mapped[str] = mapped_column(String(14), index=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    type: Mapped[str] = mapped_column(String(40))
    from_status: Mapped[str | None] = mapped_column(String(20))
    to_status: Mapped[str | None] = mapped_column(String(20))
    message: Mapped[str] = mapped_column(Text, default="")


class PlacementLock(Base):
    """A single row every placement updates first, so placements serialise on every
    backend (SQLite's write lock, PostgreSQL's row lock)."""

    __tablename__ = "placement_lock"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    counter: Mapped[int] = mapped_column(BigInteger, default=0)


class StartupSample(Base):
    """Measured create->running durations; estimated_ready_at comes from these."""

    __tablename__ = "startup_samples"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    seconds: Mapped[float] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class UsageInterval(Base):
    """One meter of one cluster billed at one rate (micro-USD per hour) from
    ``started_at`` to ``ended_at`` (None while open). Opened and closed only by the
    status funnel (services/lifecycle.py) and at creation; see core/ledger.py."""

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
    # write to the cluster's project (services/cluster_access.py). None: nobody's
    # (a key stored before owners were recorded in an account without an owner).
    user_id: Mapped[int | None] = mapped_column(ForeignKey("users.id"), index=True, default=None)
    # Registered through an API key restricted to one project: it opens only that
    # project's clusters.
    project_id: Mapped[int | None] = mapped_column(ForeignKey("projects.id"), default=None)


class ImageVersion(Base):
    """A node image users may pick by id (``image_version_id``)."""

    __tablename__ = "image_versions"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    version: Mapped[str] = mapped_column(String(100))
    image: Mapped[str] = mapped_column(String(512), unique=True)
    description: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Plan(Base):
    """A node size with its price (``sku_id``)."""

    __tablename__ = "plans"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    gpu_type: Mapped[str] = mapped_column(String(100))
    gpus_per_node: Mapped[int] = mapped_column(Integer)
    cpus_per_node: Mapped[int] = mapped_column(Integer)
    memory_gb_per_node: Mapped[int] = mapped_column(Integer)


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
    """Inbound rules (core/secgroups.py); enforced for clusters that attach them."""

    __tablename__ = "security_groups"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"), index=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("projects.id"))
    name: Mapped[str] = mapped_column(String(200))
    description: Mapped[str] = mapped_column(Text, default="")
    rules: Mapped[list[Any]] = mapped_column(default=list)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


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


class ProxySession(Base):
    """An ``open`` link to one private http port of one cluster, and the session it
    becomes. The link's one-time ``token`` is stored only as its SHA-256; exchanging it
    (once, before ``link_expires_at``) sets a cookie of its own (random; stored only as
    ``cookie_hash``) that opens this port alone until ``expires_at`` — while
    ``revoked_at`` is unset and the API key that asked (``api_key_id``, its name in
    ``key_name``) is live and its user may still change the cluster; the proxy asks the
    API on every request (services/proxy_access.py)."""

    __tablename__ = "proxy_sessions"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    cluster_id: Mapped[str] = mapped_column(String(14), index=True)
    internal_port: Mapped[int] = mapped_column(Integer)
    account_id: Mapped[int] = mapped_column(Integer)
    key_name: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    link_expires_at: Mapped[datetime] = mapped_column()
    used_at: Mapped[datetime | None] = mapped_column()
    expires_at: Mapped[datetime] = mapped_column(index=True)
    cookie_hash: Mapped[str | None] = mapped_column(String(64), index=True, unique=True)
    api_key_id: Mapped[int | None] = mapped_column(Integer)
    user_id: Mapped[int | None] = mapped_column(Integer)
    revoked_at: Mapped[datetime | None] = mapped_column()


class ClusterLogArchive(Base):
    """The output of one container of a cluster, kept when the container goes (stop,
    restart, recreate), so a stopped or errored cluster's logs stay readable until it
    is terminated. ``text`` holds one ``<RFC 3339 ns timestamp> <line>`` per line."""

    __tablename__ = "cluster_log_archives"
    __table_args__ = (Index("ix_cluster_log_archives_cluster", "cluster_id", "id"),)
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    cluster_id: Mapped[str] = mapped_column(String(14))
    container_id: Mapped[str | None] = mapped_column(String(128))
    first_at: Mapped[datetime | None] = mapped_column()
    last_at: Mapped[datetime | None] = mapped_column()
    line_count: Mapped[int] = mapped_column(Integer, default=0)
    text: Mapped[str] = mapped_column(Text, default="")
    captured_at: Mapped[datetime] = mapped_column(default=utcnow)


class UtilizationSample(Base):
    """One reading of a running cluster's CPU, memory and GPU utilisation (percent),
    for the last hour's charts (reconciler/duties/utilization.py writes them every
    ``every_s`` and deletes those older than its window). ``gpu_percent`` is NULL when
    the GPUs cannot be read (none, or no driver): no data, never a made-up zero."""

    __tablename__ = "utilization_samples"
    __table_args__ = (Index("ix_utilization_samples_cluster_at", "cluster_id", "at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    cluster_id: Mapped[str] = mapped_column(String(14))
    at: Mapped[datetime] = mapped_column(index=True)
    cpu_percent: Mapped[float] = mapped_column(Float)
    memory_percent: Mapped[float] = mapped_column(Float)
    gpu_percent: Mapped[float | None] = mapped_column(Float)
