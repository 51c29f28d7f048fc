"""hosts say whether their engine enforces disk sizes (volumes and container disks),
and why not, as they say it for CPU/memory limits

Revision ID: 0018
Revises: 0017
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("hosts") as batch:
        batch.add_column(
            sa.Column("enforces_disk", sa.Boolean(), nullable=False, server_default=sa.true())
        )
        batch.add_column(sa.Column("disk_note", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("hosts") as batch:
        batch.drop_column("disk_note")
        batch.drop_column("enforces_disk")
