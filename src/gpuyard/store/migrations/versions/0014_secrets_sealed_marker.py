"""installation.secrets_sealed_at: when the start-up pass last sealed the plaintext
secrets of older versions (null: never; the next start runs it once)

Revision ID: 0014
Revises: 0013
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("installation") as batch:
        batch.add_column(sa.Column("secrets_sealed_at", sa.DateTime(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("installation") as batch:
        batch.drop_column("secrets_sealed_at")
