"""hosts' ``client_address``: where clients reach the host's published ports (an IP
or DNS name) when that is not its own address; null: its address.

Revision ID: 0030
Revises: 0029
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0030"
down_revision = "0029"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("hosts", sa.Column("client_address", sa.String(253), nullable=True))


def downgrade() -> None:
    # A plain DROP COLUMN (SQLite 3.35+): a batch would copy ``hosts``, which clusters'
    # foreign keys refuse while clusters name a host (as 0018).
    op.drop_column("hosts", "client_address")
