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
    # Plain ALTER TABLEs, not a batch copy (see downgrade).
    op.add_column(
        "hosts",
        sa.Column("enforces_disk", sa.Boolean(), nullable=False, server_default=sa.true()),
    )
    op.add_column("hosts", sa.Column("disk_note", sa.Text(), nullable=True))


def downgrade() -> None:
    # Plain DROP COLUMNs (SQLite 3.35+), not a batch copy: a copy drops and remakes
    # ``hosts``, which clusters' foreign keys refuse while clusters name a host.
    op.drop_column("hosts", "disk_note")
    op.drop_column("hosts", "enforces_disk")
