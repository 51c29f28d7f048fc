"""training nodes: how their lifecycle script went

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("training_nodes") as batch:
        batch.add_column(sa.Column("lifecycle_status", sa.String(20), nullable=True))
        batch.add_column(sa.Column("lifecycle_exit_code", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("training_nodes") as batch:
        batch.drop_column("lifecycle_exit_code")
        batch.drop_column("lifecycle_status")
