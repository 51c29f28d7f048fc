"""utilization samples: a running cluster's CPU, memory and GPU utilisation over the
last hour, for the console's charts (``GET /v1/clusters/{id}/metrics``).

Revision ID: 0023
Revises: 0022
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "utilization_samples",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("cluster_id", sa.String(14), nullable=False),
        sa.Column("at", sa.DateTime(), nullable=False),
        sa.Column("cpu_percent", sa.Float(), nullable=False),
        sa.Column("memory_percent", sa.Float(), nullable=False),
        sa.Column("gpu_percent", sa.Float(), nullable=True),
    )
    op.create_index(
        "ix_utilization_samples_cluster_at", "utilization_samples", ["cluster_id", "at"]
    )
    op.create_index("ix_utilization_samples_at", "utilization_samples", ["at"])


def downgrade() -> None:
    op.drop_table("utilization_samples")
