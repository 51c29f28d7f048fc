"""an installation remembers when it was restored from a backup (``restored_at``), and a
quarantined volume may be kept until an admin deletes it (``delete_after`` NULL): the
volumes a restore finds that the backup did not know are never deleted by the
retention.

Revision ID: 0022
Revises: 0021
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("installation") as batch:
        batch.add_column(sa.Column("restored_at", sa.DateTime(), nullable=True))
    with op.batch_alter_table("orphan_volumes") as batch:
        batch.alter_column("delete_after", existing_type=sa.DateTime(), nullable=True)


def downgrade() -> None:
    op.execute("UPDATE orphan_volumes SET delete_after = found_at WHERE delete_after IS NULL")
    with op.batch_alter_table("orphan_volumes") as batch:
        batch.alter_column("delete_after", existing_type=sa.DateTime(), nullable=False)
    with op.batch_alter_table("installation") as batch:
        batch.drop_column("restored_at")
