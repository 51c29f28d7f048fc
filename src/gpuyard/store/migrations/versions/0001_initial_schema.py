"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-22 01:57:59.414864
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "accounts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_table(
        "events",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("cluster_id", sa.String(length=14), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("type", sa.String(length=40), nullable=False),
        sa.Column("from_status", sa.String(length=20), nullable=True),
        sa.Column("to_status", sa.String(length=20), nullable=True),
        sa.Column("message", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_events_cluster_id"), ["cluster_id"], unique=False)

    op.create_table(
        "gpu_types",
        sa.Column("id", sa.String(length=100), nullable=False),
        sa.Column("display_name", sa.String(length=100), nullable=False),
        sa.Column("manufacturer", sa.String(length=50), nullable=False),
        sa.Column("memory_gb", sa.Integer(), nullable=False),
        sa.Column("secure_price", sa.Float(), nullable=False),
        sa.Column("community_price", sa.Float(), nullable=False),
        sa.Column("secure_spot_price", sa.Float(), nullable=False),
        sa.Column("community_spot_price", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_table(
        "hosts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("location", sa.String(length=100), nullable=False),
        sa.Column("cloud_type", sa.String(length=20), nullable=False),
        sa.Column("address", sa.String(length=200), nullable=False),
        sa.Column("engine_url", sa.String(length=500), nullable=True),
        sa.Column("vcpus", sa.Integer(), nullable=False),
        sa.Column("memory_gb", sa.Integer(), nullable=False),
        sa.Column("disk_gb", sa.Integer(), nullable=False),
        sa.Column("gpu_source", sa.String(length=20), nullable=False),
        sa.Column("declared", sa.JSON(), nullable=False),
        sa.Column("healthy", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("name"),
    )
    op.create_table(
        "placement_lock",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("counter", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.bulk_insert(
        sa.table(
            "placement_lock", sa.column("id", sa.Integer), sa.column("counter", sa.BigInteger)
        ),
        [{"id": 1, "counter": 0}],
    )
    op.create_table(
        "startup_samples",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("seconds", sa.Float(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_table(
        "users",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("email", sa.String(length=320), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("is_admin", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("email"),
    )
    op.create_table(
        "api_keys",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("account_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("prefix", sa.String(length=20), nullable=False),
        sa.Column("key_hash", sa.String(length=64), nullable=False),
        sa.Column("scope", sa.String(length=10), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("revoked_at", sa.DateTime(), nullable=True),
        sa.ForeignKeyConstraint(
            ["account_id"],
            ["accounts.id"],
        ),
        sa.ForeignKeyConstraint(
            ["user_id"],
            ["users.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("key_hash"),
    )
    op.create_table(
        "host_gpus",
        sa.Column("host_id", sa.Integer(), nullable=False),
        sa.Column("gpu_index", sa.Integer(), nullable=False),
        sa.Column("gpu_type", sa.String(length=100), nullable=False),
        sa.Column("uuid", sa.String(length=100), nullable=True),
        sa.ForeignKeyConstraint(
            ["host_id"],
            ["hosts.id"],
        ),
        sa.PrimaryKeyConstraint("host_id", "gpu_index"),
    )
    op.create_table(
        "members",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("account_id", sa.Integer(), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("role", sa.String(length=20), nullable=False),
        sa.ForeignKeyConstraint(
            ["account_id"],
            ["accounts.id"],
        ),
        sa.ForeignKeyConstraint(
            ["user_id"],
            ["users.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("account_id", "user_id"),
    )
    op.create_table(
        "projects",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("account_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("is_default", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["account_id"],
            ["accounts.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("projects", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_projects_account_id"), ["account_id"], unique=False)

    op.create_table(
        "clusters",
        sa.Column("id", sa.String(length=14), nullable=False),
        sa.Column("project_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("image", sa.String(length=512), nullable=False),
        sa.Column("docker_args", sa.Text(), nullable=False),
        sa.Column("env", sa.JSON(), nullable=False),
        sa.Column("ports", sa.JSON(), nullable=False),
        sa.Column("gpu_type", sa.String(length=100), nullable=True),
        sa.Column("gpu_count", sa.Integer(), nullable=False),
        sa.Column("cpu_cores", sa.Integer(), nullable=False),
        sa.Column("memory_gb", sa.Integer(), nullable=False),
        sa.Column("container_disk_gb", sa.Integer(), nullable=False),
        sa.Column("volume_gb", sa.Integer(), nullable=False),
        sa.Column("volume_mount_path", sa.String(length=512), nullable=False),
        sa.Column("cloud_type", sa.String(length=20), nullable=False),
        sa.Column("auto_terminate", sa.JSON(), nullable=False),
        sa.Column("desired_status", sa.String(length=20), nullable=False),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("status_reason", sa.Text(), nullable=False),
        sa.Column("error_message", sa.Text(), nullable=True),
        sa.Column("startup_step", sa.Integer(), nullable=False),
        sa.Column("host_id", sa.Integer(), nullable=True),
        sa.Column("gpu_indices", sa.JSON(), nullable=False),
        sa.Column("runtime_handle", sa.JSON(), nullable=False),
        sa.Column("start_initiated_at", sa.DateTime(), nullable=True),
        sa.Column("started_at", sa.DateTime(), nullable=True),
        sa.Column("stopped_at", sa.DateTime(), nullable=True),
        sa.Column("terminated_at", sa.DateTime(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["host_id"],
            ["hosts.id"],
        ),
        sa.ForeignKeyConstraint(
            ["project_id"],
            ["projects.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("clusters", schema=None) as batch_op:
        batch_op.create_index("ix_clusters_project_status", ["project_id", "status"], unique=False)
        batch_op.create_index(batch_op.f("ix_clusters_status"), ["status"], unique=False)

    op.create_table(
        "gpu_allocations",
        sa.Column("host_id", sa.Integer(), nullable=False),
        sa.Column("gpu_index", sa.Integer(), nullable=False),
        sa.Column("cluster_id", sa.String(length=14), nullable=False),
        sa.ForeignKeyConstraint(
            ["cluster_id"],
            ["clusters.id"],
        ),
        sa.ForeignKeyConstraint(
            ["host_id"],
            ["hosts.id"],
        ),
        sa.PrimaryKeyConstraint("host_id", "gpu_index"),
    )
    with op.batch_alter_table("gpu_allocations", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_gpu_allocations_cluster_id"), ["cluster_id"], unique=False
        )

    op.create_table(
        "port_allocations",
        sa.Column("host_id", sa.Integer(), nullable=False),
        sa.Column("port", sa.Integer(), nullable=False),
        sa.Column("protocol", sa.String(length=4), nullable=False),
        sa.Column("cluster_id", sa.String(length=14), nullable=False),
        sa.Column("internal_port", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["cluster_id"],
            ["clusters.id"],
        ),
        sa.ForeignKeyConstraint(
            ["host_id"],
            ["hosts.id"],
        ),
        sa.PrimaryKeyConstraint("host_id", "port", "protocol"),
    )
    with op.batch_alter_table("port_allocations", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_port_allocations_cluster_id"), ["cluster_id"], unique=False
        )

    op.create_table(
        "reservations",
        sa.Column("cluster_id", sa.String(length=14), nullable=False),
        sa.Column("host_id", sa.Integer(), nullable=False),
        sa.Column("vcpus", sa.Integer(), nullable=False),
        sa.Column("memory_gb", sa.Integer(), nullable=False),
        sa.Column("container_disk_gb", sa.Integer(), nullable=False),
        sa.Column("volume_gb", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["cluster_id"],
            ["clusters.id"],
        ),
        sa.ForeignKeyConstraint(
            ["host_id"],
            ["hosts.id"],
        ),
        sa.PrimaryKeyConstraint("cluster_id"),
    )
    with op.batch_alter_table("reservations", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_reservations_host_id"), ["host_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("reservations", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_reservations_host_id"))

    op.drop_table("reservations")
    with op.batch_alter_table("port_allocations", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_port_allocations_cluster_id"))

    op.drop_table("port_allocations")
    with op.batch_alter_table("gpu_allocations", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_gpu_allocations_cluster_id"))

    op.drop_table("gpu_allocations")
    with op.batch_alter_table("clusters", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_clusters_status"))
        batch_op.drop_index("ix_clusters_project_status")

    op.drop_table("clusters")
    with op.batch_alter_table("projects", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_projects_account_id"))

    op.drop_table("projects")
    op.drop_table("members")
    op.drop_table("host_gpus")
    op.drop_table("api_keys")
    op.drop_table("users")
    op.drop_table("startup_samples")
    op.drop_table("placement_lock")
    op.drop_table("hosts")
    op.drop_table("gpu_types")
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_events_cluster_id"))

    op.drop_table("events")
    op.drop_table("accounts")
