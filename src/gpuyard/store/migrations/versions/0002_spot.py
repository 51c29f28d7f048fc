"""spot market: interruptible clusters and their bids

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("clusters") as batch:
        batch.add_column(
            sa.Column("interruptible", sa.Boolean(), nullable=False, server_default=sa.false())
        )
        batch.add_column(sa.Column("bid_per_gpu", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("clusters") as batch:
        batch.drop_column("bid_per_gpu")
        batch.drop_column("interruptible")
