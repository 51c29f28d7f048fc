"""storage: snapshots, restores, network volumes, measured volume usage

``snapshots`` records each saved copy of a volume (its data lives in the restic
repository, tagged with the snapshot's id). ``volume_restores`` records a snapshot
being restored into a new engine volume that replaces the old one once whole.
``network_volumes`` are volumes that outlive clusters; a cluster names the one it
mounts in ``clusters.network_volume_id``. Clusters also keep their volume's last
measured usage.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("clusters") as batch:
        batch.add_column(sa.Column("network_volume_id", sa.String(14), nullable=True))
        batch.add_column(sa.Column("volume_used_bytes", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("volume_measured_at", sa.DateTime(), nullable=True))
        batch.create_index("ix_clusters_network_volume_id", ["network_volume_id"])
    op.create_table(
        "network_volumes",
        sa.Column("id", sa.String(14), primary_key=True),
        sa.Column("account_id", sa.Integer(), sa.ForeignKey("accounts.id"), nullable=False),
        sa.Column("project_id", sa.Integer(), sa.ForeignKey("projects.id"), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("size_gb", sa.Integer(), nullable=False),
        sa.Column("host_id", sa.Integer(), nullable=False),
        sa.Column("location", sa.String(100), nullable=False),
        sa.Column("volume_name", sa.String(255), nullable=False),
        sa.Column("used_bytes", sa.BigInteger(), nullable=True),
        sa.Column("measured_at", sa.DateTime(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.Column("deleted_at", sa.DateTime(), nullable=True),
        sa.Column("version", sa.Integer(), nullable=False),
    )
    op.create_index("ix_network_volumes_account_id", "network_volumes", ["account_id"])
    op.create_index("ix_network_volumes_host_id", "network_volumes", ["host_id"])
    op.create_table(
        "snapshots",
        sa.Column("id", sa.String(14), primary_key=True),
        sa.Column("account_id", sa.Integer(), sa.ForeignKey("accounts.id"), nullable=False),
        sa.Column("project_id", sa.Integer(), sa.ForeignKey("projects.id"), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("source_cluster_id", sa.String(14), nullable=True),
        sa.Column("source_network_volume_id", sa.String(14), nullable=True),
        sa.Column("host_id", sa.Integer(), nullable=False),
        sa.Column("volume_name", sa.String(255), nullable=False),
        sa.Column("volume_gb", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("consistency", sa.String(20), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("size_bytes", sa.BigInteger(), nullable=True),
        sa.Column("stored_bytes", sa.BigInteger(), nullable=True),
        sa.Column("file_count", sa.Integer(), nullable=True),
        sa.Column("bytes_done", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("restic_id", sa.String(64), nullable=True),
        sa.Column("format", sa.String(10), nullable=False, server_default="tar"),
        sa.Column("worker", sa.String(100), nullable=True),
        sa.Column("heartbeat_at", sa.DateTime(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("ready_at", sa.DateTime(), nullable=True),
        sa.Column("deleted_at", sa.DateTime(), nullable=True),
    )
    op.create_index("ix_snapshots_account_created", "snapshots", ["account_id", "created_at"])
    op.create_index("ix_snapshots_project_id", "snapshots", ["project_id"])
    op.create_index("ix_snapshots_source_cluster_id", "snapshots", ["source_cluster_id"])
    op.create_index(
        "ix_snapshots_source_network_volume_id", "snapshots", ["source_network_volume_id"]
    )
    op.create_index("ix_snapshots_status", "snapshots", ["status"])
    op.create_table(
        "volume_restores",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("holder_id", sa.String(14), nullable=False),
        sa.Column("snapshot_id", sa.String(14), nullable=False),
        sa.Column("after_snapshot_id", sa.String(14), nullable=True),
        sa.Column("host_id", sa.Integer(), nullable=False),
        sa.Column("target_volume", sa.String(255), nullable=False),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("bytes_done", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("total_bytes", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("started_at", sa.DateTime(), nullable=False),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
    )
    op.create_index("ix_volume_restores_holder_id", "volume_restores", ["holder_id"])


def downgrade() -> None:
    op.drop_index("ix_volume_restores_holder_id", table_name="volume_restores")
    op.drop_table("volume_restores")
    for index in (
        "ix_snapshots_status",
        "ix_snapshots_source_network_volume_id",
        "ix_snapshots_source_cluster_id",
        "ix_snapshots_project_id",
        "ix_snapshots_account_created",
    ):
        op.drop_index(index, table_name="snapshots")
    op.drop_table("snapshots")
    op.drop_index("ix_network_volumes_host_id", table_name="network_volumes")
    op.drop_index("ix_network_volumes_account_id", table_name="network_volumes")
    op.drop_table("network_volumes")
    with op.batch_alter_table("clusters") as batch:
        batch.drop_index("ix_clusters_network_volume_id")
        for column in ("volume_measured_at", "volume_used_bytes", "network_volume_id"):
            batch.drop_column(column)
