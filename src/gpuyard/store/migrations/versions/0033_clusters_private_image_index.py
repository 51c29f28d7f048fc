"""A partial index of the images clusters pull with registry credentials:
clusters(image) WHERE registry_auth_id IS NOT NULL.

Every start asks whether any cluster names its image with credentials
(services/tenancy/registry_auths.py ``is_private_image``: then the registry is asked
again, so a copy on the host from one account's pull is nobody else's). Without this
index that was a pass over every ``clusters`` row, terminated ones included, on each
start; with it, a look into an index of only the clusters that have credentials.

Revision ID: 0033
Revises: 0032
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0033"
down_revision = "0032"
branch_labels = None
depends_on = None

_WHERE = sa.text("registry_auth_id IS NOT NULL")


def upgrade() -> None:
    op.create_index(
        "ix_clusters_private_image",
        "clusters",
        ["image"],
        sqlite_where=_WHERE,
        postgresql_where=_WHERE,
    )


def downgrade() -> None:
    op.drop_index("ix_clusters_private_image", table_name="clusters")
