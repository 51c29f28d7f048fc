"""usage ledger: per-meter intervals at a fixed rate

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "usage_intervals",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            primary_key=True,
            autoincrement=True,
        ),
        sa.Column("cluster_id", sa.String(14), nullable=False),
        sa.Column("project_id", sa.Integer(), nullable=False),
        sa.Column("meter", sa.String(20), nullable=False),
        sa.Column("gpu_type", sa.String(100), nullable=True),
        sa.Column("rate_micro", sa.BigInteger(), nullable=False),
        sa.Column("started_at", sa.DateTime(), nullable=False),
        sa.Column("ended_at", sa.DateTime(), nullable=True),
    )
    op.create_index("ix_usage_intervals_cluster", "usage_intervals", ["cluster_id", "started_at"])
    op.create_index("ix_usage_intervals_project", "usage_intervals", ["project_id", "started_at"])


def downgrade() -> None:
    op.drop_index("ix_usage_intervals_project", table_name="usage_intervals")
    op.drop_index("ix_usage_intervals_cluster", table_name="usage_intervals")
    op.drop_table("usage_intervals")
