"""Serverless endpoints (RunPod's other product): an endpoint is an image and a
handler; its jobs wait in a durable queue (``serverless_jobs``, streamed output in
``serverless_job_chunks``) and are taken by its workers (``serverless_workers``), each
a cluster (``clusters.serverless_endpoint_id``) that the reconciler starts and stops as
the queue grows and empties (migration 0031)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    Boolean,
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


class ServerlessEndpoint(Base):
    """What an endpoint's workers are (image, GPUs, env, volume, places) and how many of
    them there may be (the scaler). ``version`` grows with every change: a worker
    records the version it was started with, so a PATCH reaches new workers only."""

    __tablename__ = "serverless_endpoints"
    __table_args__ = (
        UniqueConstraint("account_id", "name", name="uq_serverless_endpoints_account_name"),
        Index("ix_serverless_endpoints_account_created", "account_id", "created_at", "id"),
    )
    id: Mapped[str] = mapped_column(String(14), primary_key=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"))
    project_id: Mapped[int] = mapped_column(ForeignKey("projects.id"))
    name: Mapped[str] = mapped_column(String(200))
    template_id: Mapped[str | None] = mapped_column(String(20))
    image: Mapped[str] = mapped_column(String(512))
    # Secret values sealed as a cluster's env is (services/clusters/stored_env).
    env: Mapped[dict[str, Any]] = mapped_column(default=dict)
    gpu_type_ids: Mapped[list[Any]] = mapped_column(default=list)
    gpu_count: Mapped[int] = mapped_column(Integer, default=1)
    cpu_cores: Mapped[int] = mapped_column(Integer, default=2)
    memory_gb: Mapped[int] = mapped_column(Integer, default=4)
    container_disk_gb: Mapped[int] = mapped_column(Integer, default=10)
    volume_gb: Mapped[int] = mapped_column(Integer, default=0)
    volume_mount_path: Mapped[str] = mapped_column(String(512), default="/runpod-volume")
    network_volume_id: Mapped[str | None] = mapped_column(String(14))
    # Location ids the workers may be placed in; empty: anywhere.
    locations: Mapped[list[Any]] = mapped_column(default=list)
    workers_min: Mapped[int] = mapped_column(Integer, default=0)
    workers_max: Mapped[int] = mapped_column(Integer, default=3)
    idle_timeout_s: Mapped[int] = mapped_column(Integer, default=5)
    # QUEUE_DELAY | REQUEST_COUNT (core/serverless/scaling.py).
    scaler_type: Mapped[str] = mapped_column(String(20), default="QUEUE_DELAY")
    scaler_value: Mapped[int] = mapped_column(Integer, default=4)
    # A job's default execution timeout (its policy may set its own); 0: none.
    execution_timeout_ms: Mapped[int] = mapped_column(Integer, default=600_000)
    flashboot: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # active | deleting (draining: no new jobs, workers stop once their jobs end).
    status: Mapped[str] = mapped_column(String(20), default="active")
    # Why the scaler cannot start the workers it wants (a quota, a budget, no capacity);
    # None: nothing in the way. Shown on the endpoint, never a silent stall.
    capacity_problem: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
    version: Mapped[int] = mapped_column(Integer, default=1)


class ServerlessJob(Base):
    """One request to an endpoint. ``status``: IN_QUEUE, IN_PROGRESS, COMPLETED, FAILED,
    CANCELLED, TIMED_OUT. A job is held by at most one worker (``worker_id``) and only
    while IN_PROGRESS; ``attempt`` grows each time a worker takes it, so an answer from a
    worker that lost the job (its attempt is older) is refused."""

    __tablename__ = "serverless_jobs"
    __table_args__ = (
        # The queue's order within an endpoint: low priority last, then oldest first.
        Index(
            "ix_serverless_jobs_queue", "endpoint_id", "status", "low_priority", "queued_at", "id"
        ),
        Index("ix_serverless_jobs_worker", "worker_id"),
        Index("ix_serverless_jobs_expires", "expires_at"),
    )
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    endpoint_id: Mapped[str] = mapped_column(ForeignKey("serverless_endpoints.id"))
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"))
    status: Mapped[str] = mapped_column(String(20), default="IN_QUEUE")
    # The request's ``input`` as JSON text (kept as given, up to the body limit).
    input_json: Mapped[str] = mapped_column(Text)
    # The handler's output as JSON text; None until it answers.
    output_json: Mapped[str | None] = mapped_column(Text)
    error: Mapped[str | None] = mapped_column(Text)
    webhook: Mapped[str | None] = mapped_column(String(2048))
    # The policy: executionTimeout (ms, 0: none), lowPriority, ttl (ms in queue+run).
    execution_timeout_ms: Mapped[int] = mapped_column(Integer, default=0)
    low_priority: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    ttl_ms: Mapped[int | None] = mapped_column(Integer)
    worker_id: Mapped[str | None] = mapped_column(String(64))
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    # How often it was given back to the queue (a worker lost, its container dead).
    retried: Mapped[int] = mapped_column(Integer, default=0)
    # The next streamed chunk's sequence number.
    next_chunk: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # When it (last) entered the queue: delayTime runs from here to started_at.
    queued_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column()
    completed_at: Mapped[datetime | None] = mapped_column()
    # When its result is forgotten (30 minutes after the end for /run, as RunPod).
    expires_at: Mapped[datetime | None] = mapped_column()
    # When its worker was told to stop it (the stop channel answers a cancelled or timed
    # out job once); None: not yet, or it never needed stopping.
    stop_sent_at: Mapped[datetime | None] = mapped_column()
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


class ServerlessJobChunk(Base):
    """One streamed piece of a job's output (a generator handler's yield), in order."""

    __tablename__ = "serverless_job_chunks"
    job_id: Mapped[str] = mapped_column(
        ForeignKey("serverless_jobs.id", ondelete="CASCADE"), primary_key=True
    )
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    output_json: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class ServerlessWorker(Base):
    """One worker of an endpoint: a cluster running the endpoint's image with RunPod's
    worker environment. ``id`` is what the worker calls itself (``RUNPOD_POD_ID``);
    ``key_hash`` the SHA-256 of its ``RUNPOD_AI_API_KEY``, which takes and answers jobs of
    this endpoint only. ``status``: starting, ready (taking jobs), recycle (to be stopped
    and replaced: it went silent, or still runs a cancelled or timed-out job), stopping,
    stopped (flashboot: its cluster kept on its host), gone."""

    __tablename__ = "serverless_workers"
    __table_args__ = (
        Index("ix_serverless_workers_endpoint_status", "endpoint_id", "status"),
        UniqueConstraint("key_hash", name="uq_serverless_workers_key_hash"),
    )
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    endpoint_id: Mapped[str] = mapped_column(ForeignKey("serverless_endpoints.id"))
    cluster_id: Mapped[str | None] = mapped_column(String(14), index=True)
    key_hash: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(20), default="starting")
    endpoint_version: Mapped[int] = mapped_column(Integer, default=1)
    # Jobs it holds now (a concurrency modifier lets a worker hold several).
    jobs_in_progress: Mapped[int] = mapped_column(Integer, default=0)
    last_ping_at: Mapped[datetime | None] = mapped_column()
    # The last time it took or finished a job (idle time runs from here).
    last_busy_at: Mapped[datetime | None] = mapped_column()
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
