"""Clusters and the capacity they claim (GPUs, reservations, ports), their events,
start-up samples, log archives, utilization samples and proxy sessions; the templates
clusters may be created from."""

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
    text,
)
from sqlalchemy.orm import Mapped, mapped_column

from gpuyard.store.schema.base import Base, utcnow


class Cluster(Base):
    __tablename__ = "clusters"
    __table_args__ = (
        Index("ix_clusters_project_status", "project_id", "status"),
        # The list's keyset order (newest first, id breaking ties) within a project.
        Index("ix_clusters_project_created", "project_id", "created_at", "id"),
        # The default (live) list's pages and count never touch terminated clusters;
        # services/clusters/lists.py repeats the predicate word for word (migration 0012).
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
        # Whether any cluster pulls an image with credentials, asked at every start
        # (services/tenancy/registry_auths.py is_private_image; migration 0033).
        Index(
            "ix_clusters_private_image",
            "image",
            sqlite_where=text("registry_auth_id IS NOT NULL"),
            postgresql_where=text("registry_auth_id IS NOT NULL"),
        ),
    )
    id: Mapped[str] = mapped_column(String(14), primary_key=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("projects.id"))
    name: Mapped[str] = mapped_column(String(200))
    image: Mapped[str] = mapped_column(String(512))
    docker_args: Mapped[str] = mapped_column(Text, default="")
    # The container's ENTRYPOINT (migration 0029); None: the image's own, []: none.
    docker_entrypoint: Mapped[list[Any] | None] = mapped_column(default=None)
    # Placed only on hosts whose CUDA driver version is at least this (migration 0029),
    # at create and at every move to another host.
    min_cuda_version: Mapped[str | None] = mapped_column(String(16), default=None)
    # And (when not None) only on hosts with one of these versions.
    allowed_cuda_versions: Mapped[list[Any] | None] = mapped_column(default=None)
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
    # The template it was created from (services/clusters/templates.py); kept as the
    # id only, so a cluster still names it after the template is deleted.
    template_id: Mapped[str | None] = mapped_column(String(20))
    # The account's registry credentials its image is pulled with (migration 0026);
    # None: an anonymous pull. Deleting the credentials leaves the id dangling: the
    # next pull is anonymous and a registry that needs them refuses it.
    registry_auth_id: Mapped[int | None] = mapped_column(Integer, default=None)
    # The serverless endpoint this cluster is a worker of (migration 0031); None: a
    # cluster of its own. Workers are started and stopped by the endpoint's scaler.
    serverless_endpoint_id: Mapped[str | None] = mapped_column(String(14), default=None)
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
    # The usage ledger's running totals (services/billing/ledger_totals.py keeps them with the
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
    # The holder: a cluster id, or a training node's owner id (core/training/clusters.py).
    cluster_id: Mapped[str] = mapped_column(String(14), index=True)


class Reservation(Base):
    """vCPU/memory/disk a cluster holds on its host. Compute drops to zero on stop;
    the volume stays reserved until terminate."""

    __tablename__ = "reservations"
    # The holder: a cluster id, or a training node's owner id (core/training/clusters.py).
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
    # The holder: a cluster id, or a training cluster's owner id (core/training/clusters.py).
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


class StartupSample(Base):
    """Measured create->running durations; estimated_ready_at comes from these."""

    __tablename__ = "startup_samples"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    seconds: Mapped[float] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class ProxySession(Base):
    """An ``open`` link to one private http port of one cluster, and the session it
    becomes. The link's one-time ``token`` is stored only as its SHA-256; exchanging it
    (once, before ``link_expires_at``) sets a cookie of its own (random; stored only as
    ``cookie_hash``) that opens this port alone until ``expires_at`` — while
    ``revoked_at`` is unset and the API key that asked (``api_key_id``, its name in
    ``key_name``) is live and its user may still change the cluster; the proxy asks the
    API on every request (services/access/proxy_access.py)."""

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


class ClusterTemplate(Base):
    """A saved configuration new clusters may be created from (RunPod's pod template):
    image, env (secret values sealed as a cluster's are), ports, disk sizes, mount
    path, docker args and a readme. Private to its account; names are unique there."""

    __tablename__ = "cluster_templates"
    __table_args__ = (
        UniqueConstraint("account_id", "name", name="uq_cluster_templates_account_name"),
        # The list's keyset order (oldest first, id breaking ties) within an account.
        Index("ix_cluster_templates_account_created", "account_id", "created_at", "id"),
    )
    id: Mapped[str] = mapped_column(String(20), primary_key=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"))
    project_id: Mapped[int] = mapped_column(ForeignKey("projects.id"))
    name: Mapped[str] = mapped_column(String(200))
    image: Mapped[str] = mapped_column(String(512))
    env: Mapped[dict[str, Any]] = mapped_column(default=dict)
    ports: Mapped[list[Any]] = mapped_column(default=list)
    container_disk_gb: Mapped[int] = mapped_column(Integer, default=10)
    volume_gb: Mapped[int] = mapped_column(Integer, default=0)
    volume_mount_path: Mapped[str] = mapped_column(String(512), default="/workspace")
    docker_args: Mapped[str] = mapped_column(Text, default="")
    # The ENTRYPOINT its clusters get (migration 0029); None: the image's own.
    docker_entrypoint: Mapped[list[Any] | None] = mapped_column(default=None)
    start_script: Mapped[str] = mapped_column(Text, default="")
    readme: Mapped[str] = mapped_column(Text, default="")
    # A registry credential's id, kept opaque (None: the image's registry needs none).
    container_registry_auth_id: Mapped[str | None] = mapped_column(String(100))
    # RunPod's isServerless: a template meant for serverless endpoints (stored and
    # answered; clusters may be created from either kind).
    is_serverless: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
