"""proxy cookies become sessions: each redeemed open link gets a random cookie of its
own (stored as its SHA-256 in ``cookie_hash``), tied to the API key that asked for the
link (``api_key_id``, ``user_id``) and revocable (``revoked_at``). Cookies handed out
before this revision (one value per port, derived from the secret key) match no row
and stop working: their holders open a new link.

Revision ID: 0019
Revises: 0018
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("proxy_sessions") as batch:
        batch.add_column(sa.Column("cookie_hash", sa.String(64), nullable=True))
        batch.add_column(sa.Column("api_key_id", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("user_id", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("revoked_at", sa.DateTime(), nullable=True))
    op.create_index("ix_proxy_sessions_cookie_hash", "proxy_sessions", ["cookie_hash"], unique=True)


def downgrade() -> None:
    op.drop_index("ix_proxy_sessions_cookie_hash", table_name="proxy_sessions")
    with op.batch_alter_table("proxy_sessions") as batch:
        batch.drop_column("revoked_at")
        batch.drop_column("user_id")
        batch.drop_column("api_key_id")
        batch.drop_column("cookie_hash")
