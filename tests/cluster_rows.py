"""Cluster rows written straight into the store, for tests of lists over many
clusters (creating hundreds through the API would test placement, not lists)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import insert, select

from gpuyard.core.ids import new_cluster_id
from gpuyard.services.context import Context
from gpuyard.store.schema import Cluster, Project

T0 = datetime(2025, 1, 1, tzinfo=UTC)


def cluster_row(project_id: int, status: str, at: datetime, name: str) -> dict[str, Any]:
    """A GPU-less cluster on no host, in ``status``, created at ``at``."""
    return {
        "id": new_cluster_id(),
        "project_id": project_id,
        "name": name,
        "image": "img",
        "cpu_cores": 1,
        "memory_gb": 1,
        "container_disk_gb": 1,
        "volume_gb": 0,
        "volume_mount_path": "/workspace",
        "cloud_type": "SECURE",
        "desired_status": status,
        "status": status,
        "created_at": at,
        "updated_at": at,
    }


def seed_clusters(
    ctx: Context, project_id: int, n: int, status: str = "stopped", *, start: datetime = T0
) -> list[str]:
    """``n`` clusters of ``project_id``, a second apart from ``start``; their ids,
    oldest first."""
    rows = [
        cluster_row(project_id, status, start + timedelta(seconds=i), f"c{i}") for i in range(n)
    ]
    with ctx.transaction() as session:
        session.execute(insert(Cluster), rows)
    return [r["id"] for r in rows]


def first_project(ctx: Context, account_id: int) -> int:
    """The account's first (default) project."""
    with ctx.read() as session:
        pid = session.scalar(
            select(Project.id).where(Project.account_id == account_id).order_by(Project.id)
        )
    assert pid is not None
    return int(pid)
