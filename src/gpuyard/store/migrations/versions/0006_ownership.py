"""ownership and recovery: the installation id, stable host ids, quarantined orphan
volumes, restart bookkeeping, idempotency keys

Clusters and training clusters that exist before this revision keep the engine names
they were created with (``gpuyard-vol-{id}``, ``gy-tc{id}``), so no volume is lost.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import uuid

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "installation",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("uuid", sa.String(36), nullable=False, unique=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
    )
    installation = sa.table(
        "installation",
        sa.column("id", sa.Integer()),
        sa.column("uuid", sa.String()),
        sa.column("created_at", sa.DateTime()),
    )
    op.execute(installation.insert().values(id=1, uuid=str(uuid.uuid4()), created_at=sa.func.now()))
    with op.batch_alter_table("hosts") as batch:
        batch.add_column(sa.Column("machine_id", sa.String(64), nullable=True))
        batch.add_column(
            sa.Column("enforces_limits", sa.Boolean(), nullable=False, server_default=sa.true())
        )
        batch.add_column(sa.Column("limits_note", sa.Text(), nullable=True))
        batch.create_unique_constraint("uq_hosts_machine_id", ["machine_id"])
    with op.batch_alter_table("clusters") as batch:
        batch.add_column(sa.Column("volume_name", sa.String(255), nullable=True))
        batch.add_column(sa.Column("restarts", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("last_exit_code", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("last_restart_at", sa.DateTime(), nullable=True))
        batch.add_column(sa.Column("next_restart_at", sa.DateTime(), nullable=True))
        batch.add_column(
            sa.Column("recent_failures", sa.JSON(), nullable=False, server_default="[]")
        )
    op.execute(
        "UPDATE clusters SET volume_name = 'gpuyard-vol-' || id WHERE status != 'terminated'"
    )
    with op.batch_alter_table("training_clusters") as batch:
        batch.add_column(sa.Column("name_prefix", sa.String(40), nullable=True))
    with op.batch_alter_table("training_nodes") as batch:
        batch.add_column(sa.Column("restarts", sa.Integer(), nullable=False, server_default="0"))
    op.create_table(
        "orphan_volumes",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("host_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("cluster_id", sa.String(64), nullable=True),
        sa.Column("size_bytes", sa.BigInteger(), nullable=True),
        sa.Column("found_at", sa.DateTime(), nullable=False),
        sa.Column("delete_after", sa.DateTime(), nullable=False),
        sa.Column("deleted_at", sa.DateTime(), nullable=True),
        sa.Column("outcome", sa.String(20), nullable=True),
        sa.UniqueConstraint("host_id", "name"),
    )
    op.create_table(
        "idempotency_keys",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("account_id", sa.Integer(), nullable=False),
        sa.Column("route", sa.String(100), nullable=False),
        sa.Column("key", sa.String(255), nullable=False),
        sa.Column("request_hash", sa.String(64), nullable=False),
        sa.Column("resource_id", sa.String(64), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("expires_at", sa.DateTime(), nullable=False),
        sa.UniqueConstraint("account_id", "route", "key"),
    )
    op.create_index("ix_idempotency_keys_expires_at", "idempotency_keys", ["expires_at"])


def downgrade() -> None:
    op.drop_index("ix_idempotency_keys_expires_at", table_name="idempotency_keys")
    op.drop_table("idempotency_keys")
    op.drop_table("orphan_volumes")
    with op.batch_alter_table("training_nodes") as batch:
        batch.drop_column("restarts")
    with op.batch_alter_table("training_clusters") as batch:
        batch.drop_column("name_prefix")
    with op.batch_alter_table("clusters") as batch:
        for column in (
            "recent_failures",
            "next_restart_at",
            "last_restart_at",
            "last_exit_code",
            "restarts",
            "volume_name",
        ):
            batch.drop_column(column)
    with op.batch_alter_table("hosts") as batch:
        batch.drop_constraint("uq_hosts_machine_id", type_="unique")
        batch.drop_column("limits_note")
        batch.drop_column("enforces_limits")
        batch.drop_column("machine_id")
    op.drop_table("installation")
