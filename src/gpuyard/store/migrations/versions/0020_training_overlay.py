"""training clusters span hosts: each cluster gets an IPv4 subnet of its own
(``training_clusters.subnet``), the same on every host its nodes run on, and each node
a fixed address in it (``training_nodes.address``), so nodes on different hosts share
one network (an overlay between the hosts). Clusters made before this revision keep
an engine-chosen subnet (both NULL) and stay on the hosts they have.

Revision ID: 0020
Revises: 0019
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("training_clusters") as batch:
        batch.add_column(sa.Column("subnet", sa.String(50), nullable=True))
    with op.batch_alter_table("training_nodes") as batch:
        batch.add_column(sa.Column("address", sa.String(50), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("training_nodes") as batch:
        batch.drop_column("address")
    with op.batch_alter_table("training_clusters") as batch:
        batch.drop_column("subnet")
