"""training clusters get an auto-termination policy (``auto_terminate``, the same
rules as a cluster's with ``action`` stop or delete) and the start of their current
run (``run_started_at``: the create, or the latest start of a stopped cluster), from
which the maximum runtime and the cost limit count. Existing clusters have no policy;
their run counts from their creation.

Revision ID: 0021
Revises: 0020
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("training_clusters") as batch:
        batch.add_column(
            sa.Column("auto_terminate", sa.JSON(), nullable=False, server_default="{}")
        )
        batch.add_column(sa.Column("run_started_at", sa.DateTime(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("training_clusters") as batch:
        batch.drop_column("run_started_at")
        batch.drop_column("auto_terminate")
