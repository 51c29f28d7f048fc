"""private registry credentials: ``registry_auths`` (the password sealed) and the
credentials a cluster's image is pulled with (``clusters.registry_auth_id``).

Revision ID: 0026
Revises: 0024
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "registry_auths",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("account_id", sa.Integer(), sa.ForeignKey("accounts.id"), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("username", sa.String(500), nullable=False),
        sa.Column("password", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.UniqueConstraint("account_id", "name"),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_registry_auths_account_id", "registry_auths", ["account_id"])
    with op.batch_alter_table("clusters") as batch:
        batch.add_column(sa.Column("registry_auth_id", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("clusters") as batch:
        batch.drop_column("registry_auth_id")
    op.drop_index("ix_registry_auths_account_id", "registry_auths")
    op.drop_table("registry_auths")
