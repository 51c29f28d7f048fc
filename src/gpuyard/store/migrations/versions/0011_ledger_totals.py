"""ledger totals on the cluster row (cost without re-reading every interval) and the
index of the keyset-paginated cluster list

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def _time(value: Any) -> datetime | None:
    """A stored timestamp (naive UTC; a string on SQLite) as aware UTC."""
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    stamp: datetime = value
    return stamp.replace(tzinfo=UTC)


def _seconds(start: datetime, end: datetime) -> int:
    return max(0, int((end - start).total_seconds()))


def upgrade() -> None:
    with op.batch_alter_table("clusters") as batch:
        for name in ("billed_closed", "billed_run_closed", "open_rate_micro"):
            batch.add_column(sa.Column(name, sa.BigInteger(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("billed_run_from", sa.DateTime(), nullable=True))
        batch.add_column(sa.Column("open_since", sa.DateTime(), nullable=True))
        batch.create_index("ix_clusters_project_created", ["project_id", "created_at", "id"])
    _backfill()


def _backfill() -> None:
    """Each cluster's totals from its intervals (the arithmetic of core/ledger.py,
    repeated here so this revision keeps meaning what it meant)."""
    bind = op.get_bind()
    starts = {
        cid: _time(at)
        for cid, at in bind.execute(sa.text("SELECT id, start_initiated_at FROM clusters"))
    }
    closed: dict[str, int] = defaultdict(int)
    run_closed: dict[str, int] = defaultdict(int)
    open_rate: dict[str, int] = defaultdict(int)
    open_since: dict[str, datetime] = {}
    rows = bind.execute(
        sa.text("SELECT cluster_id, rate_micro, started_at, ended_at FROM usage_intervals")
    )
    for cid, rate, started_raw, ended_raw in rows:
        if cid not in starts:
            continue  # a snapshot's or a network volume's interval
        started, ended = _time(started_raw), _time(ended_raw)
        assert started is not None
        if ended is None:
            open_rate[cid] += rate
            open_since[cid] = min(open_since.get(cid, started), started)
            continue
        closed[cid] += rate * _seconds(started, ended)
        run_start = starts[cid]
        if run_start is not None:
            run_closed[cid] += rate * _seconds(
                max(started, run_start.replace(microsecond=0)), ended
            )
    update = sa.text(
        "UPDATE clusters SET billed_closed = :closed, billed_run_closed = :run_closed, "
        "billed_run_from = :run_from, open_rate_micro = :rate, open_since = :since "
        "WHERE id = :id"
    )
    for cid in set(closed) | set(open_rate):
        run_start = starts[cid]
        bind.execute(
            update,
            {
                "id": cid,
                "closed": closed[cid],
                "run_closed": run_closed[cid],
                "run_from": (run_start.replace(microsecond=0, tzinfo=None) if run_start else None),
                "rate": open_rate[cid],
                "since": open_since[cid].replace(tzinfo=None) if cid in open_since else None,
            },
        )


def downgrade() -> None:
    with op.batch_alter_table("clusters") as batch:
        batch.drop_index("ix_clusters_project_created")
        for name in (
            "billed_closed",
            "billed_run_closed",
            "open_rate_micro",
            "billed_run_from",
            "open_since",
        ):
            batch.drop_column(name)
