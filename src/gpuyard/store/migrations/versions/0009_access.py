"""access: proxy sessions and archived cluster logs

``proxy_sessions`` are the ``open`` links of private http ports and the cookies they
become (see store/schema/clusters.py ProxySession). ``cluster_log_archives`` keeps the output of
containers that are gone, so logs of stopped and errored clusters stay readable.

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "proxy_sessions",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("token_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("cluster_id", sa.String(14), nullable=False),
        sa.Column("internal_port", sa.Integer(), nullable=False),
        sa.Column("account_id", sa.Integer(), nullable=False),
        sa.Column("key_name", sa.String(200), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("link_expires_at", sa.DateTime(), nullable=False),
        sa.Column("used_at", sa.DateTime(), nullable=True),
        sa.Column("expires_at", sa.DateTime(), nullable=False),
    )
    op.create_index("ix_proxy_sessions_cluster_id", "proxy_sessions", ["cluster_id"])
    op.create_index("ix_proxy_sessions_expires_at", "proxy_sessions", ["expires_at"])
    op.create_table(
        "cluster_log_archives",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            primary_key=True,
        ),
        sa.Column("cluster_id", sa.String(14), nullable=False),
        sa.Column("container_id", sa.String(128), nullable=True),
        sa.Column("first_at", sa.DateTime(), nullable=True),
        sa.Column("last_at", sa.DateTime(), nullable=True),
        sa.Column("line_count", sa.Integer(), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("captured_at", sa.DateTime(), nullable=False),
    )
    op.create_index("ix_cluster_log_archives_cluster", "cluster_log_archives", ["cluster_id", "id"])


def downgrade() -> None:
    op.drop_index("ix_cluster_log_archives_cluster", table_name="cluster_log_archives")
    op.drop_table("cluster_log_archives")
    op.drop_index("ix_proxy_sessions_expires_at", table_name="proxy_sessions")
    op.drop_index("ix_proxy_sessions_cluster_id", table_name="proxy_sessions")
    op.drop_table("proxy_sessions")
