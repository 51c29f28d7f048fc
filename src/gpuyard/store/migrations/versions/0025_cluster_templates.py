"""cluster templates (``cluster_templates``: saved configurations clusters are created
from) and the template a cluster was created from (``clusters.template_id``).

Revision ID: 0025
Revises: 0024
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "cluster_templates",
        sa.Column("id", sa.String(20), primary_key=True),
        sa.Column("account_id", sa.Integer(), sa.ForeignKey("accounts.id"), nullable=False),
        sa.Column("project_id", sa.Integer(), sa.ForeignKey("projects.id"), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("image", sa.String(512), nullable=False),
        sa.Column("env", sa.JSON(), nullable=False),
        sa.Column("ports", sa.JSON(), nullable=False),
        sa.Column("container_disk_gb", sa.Integer(), nullable=False),
        sa.Column("volume_gb", sa.Integer(), nullable=False),
        sa.Column("volume_mount_path", sa.String(512), nullable=False),
        sa.Column("docker_args", sa.Text(), nullable=False),
        sa.Column("start_script", sa.Text(), nullable=False),
        sa.Column("readme", sa.Text(), nullable=False),
        sa.Column("container_registry_auth_id", sa.String(100), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.UniqueConstraint("account_id", "name", name="uq_cluster_templates_account_name"),
    )
    op.create_index(
        "ix_cluster_templates_account_created",
        "cluster_templates",
        ["account_id", "created_at", "id"],
    )
    with op.batch_alter_table("clusters") as batch:
        batch.add_column(sa.Column("template_id", sa.String(20), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("clusters") as batch:
        batch.drop_column("template_id")
    op.drop_index("ix_cluster_templates_account_created", table_name="cluster_templates")
    op.drop_table("cluster_templates")
