"""serverless endpoints: ``serverless_endpoints``, their durable job queue
(``serverless_jobs``, streamed output in ``serverless_job_chunks``), their workers
(``serverless_workers``) and the endpoint a worker cluster belongs to
(``clusters.serverless_endpoint_id``).

Revision ID: 0031
Revises: 0030
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0031"
down_revision = "0030"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "serverless_endpoints",
        sa.Column("id", sa.String(14), primary_key=True),
        sa.Column("account_id", sa.Integer(), sa.ForeignKey("accounts.id"), nullable=False),
        sa.Column("project_id", sa.Integer(), sa.ForeignKey("projects.id"), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("template_id", sa.String(20), nullable=True),
        sa.Column("image", sa.String(512), nullable=False),
        sa.Column("env", sa.JSON(), nullable=False),
        sa.Column("gpu_type_ids", sa.JSON(), nullable=False),
        sa.Column("gpu_count", sa.Integer(), nullable=False),
        sa.Column("cpu_cores", sa.Integer(), nullable=False),
        sa.Column("memory_gb", sa.Integer(), nullable=False),
        sa.Column("container_disk_gb", sa.Integer(), nullable=False),
        sa.Column("volume_gb", sa.Integer(), nullable=False),
        sa.Column("volume_mount_path", sa.String(512), nullable=False),
        sa.Column("network_volume_id", sa.String(14), nullable=True),
        sa.Column("locations", sa.JSON(), nullable=False),
        sa.Column("workers_min", sa.Integer(), nullable=False),
        sa.Column("workers_max", sa.Integer(), nullable=False),
        sa.Column("idle_timeout_s", sa.Integer(), nullable=False),
        sa.Column("scaler_type", sa.String(20), nullable=False),
        sa.Column("scaler_value", sa.Integer(), nullable=False),
        sa.Column("execution_timeout_ms", sa.Integer(), nullable=False),
        sa.Column("flashboot", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("capacity_problem", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.UniqueConstraint("account_id", "name", name="uq_serverless_endpoints_account_name"),
    )
    op.create_index(
        "ix_serverless_endpoints_account_created",
        "serverless_endpoints",
        ["account_id", "created_at", "id"],
    )
    op.create_table(
        "serverless_jobs",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column(
            "endpoint_id",
            sa.String(14),
            sa.ForeignKey("serverless_endpoints.id"),
            nullable=False,
        ),
        sa.Column("account_id", sa.Integer(), sa.ForeignKey("accounts.id"), nullable=False),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("input_json", sa.Text(), nullable=False),
        sa.Column("output_json", sa.Text(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("webhook", sa.String(2048), nullable=True),
        sa.Column("execution_timeout_ms", sa.Integer(), nullable=False),
        sa.Column("low_priority", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("ttl_ms", sa.Integer(), nullable=True),
        sa.Column("worker_id", sa.String(64), nullable=True),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("retried", sa.Integer(), nullable=False),
        sa.Column("next_chunk", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("queued_at", sa.DateTime(), nullable=False),
        sa.Column("started_at", sa.DateTime(), nullable=True),
        sa.Column("completed_at", sa.DateTime(), nullable=True),
        sa.Column("expires_at", sa.DateTime(), nullable=True),
        sa.Column("stop_sent_at", sa.DateTime(), nullable=True),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
    )
    op.create_index(
        "ix_serverless_jobs_queue",
        "serverless_jobs",
        ["endpoint_id", "status", "low_priority", "queued_at", "id"],
    )
    op.create_index("ix_serverless_jobs_worker", "serverless_jobs", ["worker_id"])
    op.create_index("ix_serverless_jobs_expires", "serverless_jobs", ["expires_at"])
    op.create_table(
        "serverless_job_chunks",
        sa.Column(
            "job_id",
            sa.String(64),
            sa.ForeignKey("serverless_jobs.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("seq", sa.Integer(), primary_key=True),
        sa.Column("output_json", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
    )
    op.create_table(
        "serverless_workers",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column(
            "endpoint_id",
            sa.String(14),
            sa.ForeignKey("serverless_endpoints.id"),
            nullable=False,
        ),
        sa.Column("cluster_id", sa.String(14), nullable=True),
        sa.Column("key_hash", sa.String(64), nullable=False),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("endpoint_version", sa.Integer(), nullable=False),
        sa.Column("jobs_in_progress", sa.Integer(), nullable=False),
        sa.Column("last_ping_at", sa.DateTime(), nullable=True),
        sa.Column("last_busy_at", sa.DateTime(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.UniqueConstraint("key_hash", name="uq_serverless_workers_key_hash"),
    )
    op.create_index(
        "ix_serverless_workers_endpoint_status", "serverless_workers", ["endpoint_id", "status"]
    )
    op.create_index("ix_serverless_workers_cluster_id", "serverless_workers", ["cluster_id"])
    op.add_column("clusters", sa.Column("serverless_endpoint_id", sa.String(14), nullable=True))


def downgrade() -> None:
    # A plain DROP COLUMN (SQLite 3.35+), as 0030: a batch copy of clusters trips the
    # foreign keys that name it.
    op.drop_column("clusters", "serverless_endpoint_id")
    op.drop_index("ix_serverless_workers_cluster_id", table_name="serverless_workers")
    op.drop_index("ix_serverless_workers_endpoint_status", table_name="serverless_workers")
    op.drop_table("serverless_workers")
    op.drop_table("serverless_job_chunks")
    op.drop_index("ix_serverless_jobs_expires", table_name="serverless_jobs")
    op.drop_index("ix_serverless_jobs_worker", table_name="serverless_jobs")
    op.drop_index("ix_serverless_jobs_queue", table_name="serverless_jobs")
    op.drop_table("serverless_jobs")
    op.drop_index("ix_serverless_endpoints_account_created", table_name="serverless_endpoints")
    op.drop_table("serverless_endpoints")
