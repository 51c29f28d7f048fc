"""index of clusters by host and status: the clusters live on a host (heartbeats, the
observe pass) read through it, never walking the host's terminated history

Revision ID: 0015
Revises: 0014
"""

from __future__ import annotations

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_clusters_host_status", "clusters", ["host_id", "status"])


def downgrade() -> None:
    op.drop_index("ix_clusters_host_status", table_name="clusters")
