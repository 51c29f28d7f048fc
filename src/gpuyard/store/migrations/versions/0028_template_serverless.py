"""templates' ``is_serverless`` (RunPod's ``isServerless``): stored and answered.

Revision ID: 0028
Revises: 0027
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0028"
down_revision = "0027"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("cluster_templates") as batch:
        batch.add_column(
            sa.Column("is_serverless", sa.Boolean, nullable=False, server_default=sa.false())
        )


def downgrade() -> None:
    with op.batch_alter_table("cluster_templates") as batch:
        batch.drop_column("is_serverless")
