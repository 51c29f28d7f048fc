"""web console sessions (issue 17): one row per signed-in browser

Revision ID: 0013
Revises: 0012
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "console_sessions",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("api_key_id", sa.Integer, sa.ForeignKey("api_keys.id"), nullable=False),
        sa.Column("sealed_key", sa.String(512), nullable=False),
        sa.Column("csrf_token", sa.String(100), nullable=False),
        sa.Column("created_at", sa.DateTime, nullable=False),
        sa.Column("last_seen_at", sa.DateTime, nullable=False),
        sa.Column("expires_at", sa.DateTime, nullable=False),
        sa.Column("revoked_at", sa.DateTime, nullable=True),
        sa.Column("user_agent", sa.String(200), nullable=False, server_default=""),
    )
    op.create_index("ix_console_sessions_api_key_id", "console_sessions", ["api_key_id"])


def downgrade() -> None:
    op.drop_index("ix_console_sessions_api_key_id", table_name="console_sessions")
    op.drop_table("console_sessions")
