"""which restic repository holds a snapshot's data: NULL, the installation-wide one
snapshots were kept in before (moved into its account's own at start-up), or
``account``, the snapshot's account's own repository

Revision ID: 0016
Revises: 0015
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("snapshots") as batch:
        batch.add_column(sa.Column("repository", sa.String(length=10), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("snapshots") as batch:
        batch.drop_column("repository")
