"""indexes of the cluster list's keyset pages: live clusters only (partial), and by
status

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

# The default list (every status but terminated) reads this partial index: terminated
# clusters are not in it, so history never lengthens a page or its count. The query
# repeats the predicate word for word (services/cluster_lists.py LIVE).
LIVE = sa.text("status != 'terminated'")


def upgrade() -> None:
    op.create_index(
        "ix_clusters_live_created",
        "clusters",
        ["project_id", "created_at", "id"],
        sqlite_where=LIVE,
        postgresql_where=LIVE,
    )
    op.create_index(
        "ix_clusters_project_status_created",
        "clusters",
        ["project_id", "status", "created_at", "id"],
    )


def downgrade() -> None:
    op.drop_index("ix_clusters_project_status_created", table_name="clusters")
    op.drop_index("ix_clusters_live_created", table_name="clusters")
