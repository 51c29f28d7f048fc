"""account secrets (``account_secrets``): named, sealed values of an account that
clusters' env refers to as ``{{ RUNPOD_SECRET_name }}``.

Revision ID: 0027
Revises: 0024
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "account_secrets",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("account_id", sa.Integer, sa.ForeignKey("accounts.id"), nullable=False),
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("description", sa.Text, nullable=False, server_default=""),
        sa.Column("value", sa.Text, nullable=False),
        sa.Column("created_at", sa.DateTime, nullable=False),
        sa.Column("updated_at", sa.DateTime, nullable=False),
        sa.UniqueConstraint("account_id", "name", name="uq_account_secrets_account_id_name"),
    )
    op.create_index("ix_account_secrets_account_id", "account_secrets", ["account_id"])


def downgrade() -> None:
    op.drop_index("ix_account_secrets_account_id", table_name="account_secrets")
    op.drop_table("account_secrets")
