"""training clusters: ssh keys, image versions, plans, reserved IPs, security groups,
training clusters and nodes; capacity rows may be held by training nodes

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

# Capacity tables whose holder column referenced clusters.id; training nodes hold
# GPUs, reservations and ports too, so the holder becomes a plain id.
_HOLDER_TABLES = ("gpu_allocations", "reservations", "port_allocations")
# SQLite reflects unnamed foreign keys; this convention names them for batch mode.
_SQLITE_FK = {"fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s"}


def _fk_name(table: str) -> str:
    if op.get_bind().dialect.name == "sqlite":
        return f"fk_{table}_cluster_id_clusters"
    return f"{table}_cluster_id_fkey"


def _batch(table: str) -> object:
    if op.get_bind().dialect.name == "sqlite":
        return op.batch_alter_table(table, naming_convention=_SQLITE_FK, recreate="always")
    return op.batch_alter_table(table)


def upgrade() -> None:
    for table in _HOLDER_TABLES:
        with _batch(table) as batch:  # type: ignore[attr-defined]
            batch.drop_constraint(_fk_name(table), type_="foreignkey")

    op.create_table(
        "ssh_keys",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("account_id", sa.Integer(), sa.ForeignKey("accounts.id"), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("public_key", sa.Text(), nullable=False),
        sa.Column("fingerprint", sa.String(100), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
    )
    op.create_index("ix_ssh_keys_account_id", "ssh_keys", ["account_id"])
    op.create_table(
        "image_versions",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("version", sa.String(100), nullable=False),
        sa.Column("image", sa.String(512), nullable=False, unique=True),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
    )
    op.create_table(
        "plans",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("name", sa.String(200), nullable=False, unique=True),
        sa.Column("gpu_type", sa.String(100), nullable=False),
        sa.Column("gpus_per_node", sa.Integer(), nullable=False),
        sa.Column("cpus_per_node", sa.Integer(), nullable=False),
        sa.Column("memory_gb_per_node", sa.Integer(), nullable=False),
    )
    op.create_table(
        "reserved_ips",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("address", sa.String(64), nullable=False, unique=True),
        sa.Column("account_id", sa.Integer(), sa.ForeignKey("accounts.id"), nullable=False),
        sa.Column("project_id", sa.Integer(), sa.ForeignKey("projects.id"), nullable=False),
        sa.Column("training_cluster_id", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
    )
    op.create_index("ix_reserved_ips_account_id", "reserved_ips", ["account_id"])
    op.create_index("ix_reserved_ips_training_cluster_id", "reserved_ips", ["training_cluster_id"])
    op.create_table(
        "security_groups",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("account_id", sa.Integer(), sa.ForeignKey("accounts.id"), nullable=False),
        sa.Column("project_id", sa.Integer(), sa.ForeignKey("projects.id"), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("rules", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
    )
    op.create_index("ix_security_groups_account_id", "security_groups", ["account_id"])
    op.create_table(
        "training_clusters",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("account_id", sa.Integer(), sa.ForeignKey("accounts.id"), nullable=False),
        sa.Column("project_id", sa.Integer(), sa.ForeignKey("projects.id"), nullable=False),
        sa.Column("location", sa.String(100), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("status_reason", sa.Text(), nullable=False),
        sa.Column("error_message", sa.Text(), nullable=True),
        sa.Column("image_version_id", sa.Integer(), nullable=False),
        sa.Column("sku_id", sa.Integer(), nullable=True),
        sa.Column("gpu_type", sa.String(100), nullable=False),
        sa.Column("gpus_per_node", sa.Integer(), nullable=False),
        sa.Column("cpus_per_node", sa.Integer(), nullable=False),
        sa.Column("memory_gb_per_node", sa.Integer(), nullable=False),
        sa.Column("ssh_key_ids", sa.JSON(), nullable=False),
        sa.Column("security_group_ids", sa.JSON(), nullable=False),
        sa.Column("lifecycle_script", sa.Text(), nullable=True),
        sa.Column("munge_key", sa.Text(), nullable=False),
        sa.Column("host_id", sa.Integer(), sa.ForeignKey("hosts.id"), nullable=True),
        sa.Column("ssh_port", sa.Integer(), nullable=True),
        sa.Column("next_worker", sa.Integer(), nullable=False),
        sa.Column("operation", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.Column("deleted_at", sa.DateTime(), nullable=True),
        sa.Column("version", sa.Integer(), nullable=False),
    )
    op.create_index("ix_training_clusters_account_id", "training_clusters", ["account_id"])
    op.create_index("ix_training_clusters_project_id", "training_clusters", ["project_id"])
    op.create_index("ix_training_clusters_status", "training_clusters", ["status"])
    op.create_table(
        "training_nodes",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column(
            "cluster_id", sa.Integer(), sa.ForeignKey("training_clusters.id"), nullable=False
        ),
        sa.Column("role", sa.String(20), nullable=False),
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("host_id", sa.Integer(), sa.ForeignKey("hosts.id"), nullable=True),
        sa.Column("gpu_indices", sa.JSON(), nullable=False),
        sa.Column("image_version_id", sa.Integer(), nullable=False),
        sa.Column("container_id", sa.String(100), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.UniqueConstraint("cluster_id", "name"),
    )
    op.create_index("ix_training_nodes_cluster_id", "training_nodes", ["cluster_id"])


def downgrade() -> None:
    for table in ("training_nodes", "training_clusters", "security_groups", "reserved_ips"):
        op.drop_table(table)
    for table in ("plans", "image_versions", "ssh_keys"):
        op.drop_table(table)
    for table in _HOLDER_TABLES:
        # Rows held by training nodes cannot reference a cluster.
        op.execute(f"DELETE FROM {table} WHERE cluster_id NOT IN (SELECT id FROM clusters)")
        with _batch(table) as batch:  # type: ignore[attr-defined]
            batch.create_foreign_key(_fk_name(table), "clusters", ["cluster_id"], ["id"])
