"""A covering index for the placement hint's fingerprint: hosts(healthy, status, id,
updated_at).

services/capacity/fleet_hint.py reads, once per placement transaction, the count, the
sum of ids and the latest ``updated_at`` of the hosts that take placements (healthy,
active). Without this index that is a pass over every ``hosts`` row (wide rows: notes,
JSON); with it, a scan of the index alone (SQLite and PostgreSQL index-only scans).

Revision ID: 0032
Revises: 0031
"""

from __future__ import annotations

from alembic import op

revision = "0032"
down_revision = "0031"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_hosts_placeable", "hosts", ["healthy", "status", "id", "updated_at"])


def downgrade() -> None:
    op.drop_index("ix_hosts_placeable", table_name="hosts")
