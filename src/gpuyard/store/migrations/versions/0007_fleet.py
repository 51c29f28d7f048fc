"""fleet: host status and heartbeats, volume moves between hosts, duty leases

Hosts get an operator status (``active``, ``cordoned``, ``draining``) apart from
reachability (``healthy`` stays the placement filter; heartbeats set it), the time of the
last answered heartbeat, the engine's name and version, and an optional location of the
engine's TLS material. ``volume_moves`` records a cluster's volume on its way to another
host (its progress survives a replica's death; the source host's disk stays counted
until the move ends). ``leases`` gives each background duty one owner among replicas.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("hosts") as batch:
        batch.add_column(
            sa.Column("status", sa.String(20), nullable=False, server_default="active")
        )
        batch.add_column(sa.Column("last_heartbeat_at", sa.DateTime(), nullable=True))
        batch.add_column(sa.Column("unreachable_since", sa.DateTime(), nullable=True))
        batch.add_column(
            sa.Column("missed_heartbeats", sa.Integer(), nullable=False, server_default="0")
        )
        batch.add_column(sa.Column("heartbeat_error", sa.Text(), nullable=True))
        batch.add_column(sa.Column("engine_name", sa.String(20), nullable=True))
        batch.add_column(sa.Column("engine_version", sa.String(100), nullable=True))
        batch.add_column(sa.Column("engine_tls_dir", sa.String(500), nullable=True))
        batch.add_column(
            sa.Column("is_local", sa.Boolean(), nullable=False, server_default=sa.false())
        )
    # The host the server registers for its own machine is the one with a machine id.
    op.execute("UPDATE hosts SET is_local = machine_id IS NOT NULL")
    op.create_table(
        "volume_moves",
        sa.Column("cluster_id", sa.String(14), primary_key=True),
        sa.Column("from_host_id", sa.Integer(), sa.ForeignKey("hosts.id"), nullable=False),
        sa.Column("to_host_id", sa.Integer(), sa.ForeignKey("hosts.id"), nullable=False),
        sa.Column("volume_gb", sa.Integer(), nullable=False),
        sa.Column("source_volume", sa.String(255), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("bytes_copied", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("seconds", sa.Float(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("started_at", sa.DateTime(), nullable=False),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
    )
    op.create_index("ix_volume_moves_from_host", "volume_moves", ["from_host_id"])
    op.create_table(
        "leases",
        sa.Column("name", sa.String(200), primary_key=True),
        sa.Column("holder", sa.String(100), nullable=False),
        sa.Column("expires_at", sa.DateTime(), nullable=False),
        sa.Column("fence", sa.BigInteger(), nullable=False, server_default="0"),
    )


def downgrade() -> None:
    op.drop_table("leases")
    op.drop_index("ix_volume_moves_from_host", table_name="volume_moves")
    op.drop_table("volume_moves")
    with op.batch_alter_table("hosts") as batch:
        for column in (
            "is_local",
            "engine_tls_dir",
            "engine_version",
            "engine_name",
            "heartbeat_error",
            "missed_heartbeats",
            "unreachable_since",
            "last_heartbeat_at",
            "status",
        ):
            batch.drop_column(column)
