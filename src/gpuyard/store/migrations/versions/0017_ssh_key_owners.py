"""SSH keys belong to the user who registered them (and, when registered with a key
restricted to a project, to that project): ``ssh_keys.user_id`` and
``ssh_keys.project_id``. Keys stored before are given to their account's oldest owner.

Revision ID: 0017
Revises: 0016
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("ssh_keys") as batch:
        batch.add_column(sa.Column("user_id", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("project_id", sa.Integer(), nullable=True))
        batch.create_foreign_key("fk_ssh_keys_user_id", "users", ["user_id"], ["id"])
        batch.create_foreign_key("fk_ssh_keys_project_id", "projects", ["project_id"], ["id"])
    op.create_index("ix_ssh_keys_user_id", "ssh_keys", ["user_id"])
    # A key from before had no owner but the account: its oldest owner takes it (the
    # one who could always manage every key), so nothing that worked stops working
    # while that owner stays.
    op.execute(
        """
        UPDATE ssh_keys SET user_id = (
            SELECT members.user_id FROM members
            WHERE members.account_id = ssh_keys.account_id AND members.role = 'owner'
            ORDER BY members.id LIMIT 1
        ) WHERE user_id IS NULL
        """
    )


def downgrade() -> None:
    op.drop_index("ix_ssh_keys_user_id", table_name="ssh_keys")
    with op.batch_alter_table("ssh_keys") as batch:
        batch.drop_constraint("fk_ssh_keys_project_id", type_="foreignkey")
        batch.drop_constraint("fk_ssh_keys_user_id", type_="foreignkey")
        batch.drop_column("project_id")
        batch.drop_column("user_id")
