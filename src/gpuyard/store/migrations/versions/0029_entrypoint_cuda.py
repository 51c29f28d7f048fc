"""a cluster's ENTRYPOINT and CUDA versions (``clusters.docker_entrypoint``,
``clusters.min_cuda_version``, ``clusters.allowed_cuda_versions``) and a host's CUDA
driver version (``hosts.cuda_version``); a template's ENTRYPOINT
(``cluster_templates.docker_entrypoint``).

Revision ID: 0029
Revises: 0028
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0029"
down_revision = "0028"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("clusters") as batch:
        batch.add_column(sa.Column("docker_entrypoint", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("min_cuda_version", sa.String(16), nullable=True))
        batch.add_column(sa.Column("allowed_cuda_versions", sa.JSON(), nullable=True))
    with op.batch_alter_table("hosts") as batch:
        batch.add_column(sa.Column("cuda_version", sa.String(16), nullable=True))
    with op.batch_alter_table("cluster_templates") as batch:
        batch.add_column(sa.Column("docker_entrypoint", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("cluster_templates") as batch:
        batch.drop_column("docker_entrypoint")
    # A plain DROP COLUMN: a batch would copy ``hosts``, which clusters' foreign keys
    # refuse while clusters name a host (as 0018).
    op.drop_column("hosts", "cuda_version")
    with op.batch_alter_table("clusters") as batch:
        batch.drop_column("allowed_cuda_versions")
        batch.drop_column("min_cuda_version")
        batch.drop_column("docker_entrypoint")
