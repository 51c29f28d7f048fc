"""Migrations: upgrade -> downgrade -> upgrade on each backend."""

from __future__ import annotations

from sqlalchemy import inspect

from gpuyard.store.db import make_engine
from gpuyard.store.migrate import downgrade, upgrade


def test_upgrade_downgrade_upgrade(database_url: str) -> None:
    engine = make_engine(database_url)
    try:
        upgrade(engine)
        assert "clusters" in inspect(engine).get_table_names()
        downgrade(engine)
        assert "clusters" not in inspect(engine).get_table_names()
        upgrade(engine)
        assert {"clusters", "gpu_allocations", "api_keys"} <= set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_the_placement_fingerprint_has_its_covering_index(database_url: str) -> None:
    """Migration 0032: hosts(healthy, status, id, updated_at), so the hint's
    fingerprint (services/capacity/fleet_hint.py) reads the index alone."""
    engine = make_engine(database_url)
    try:
        upgrade(engine)
        indexes = {i["name"]: i["column_names"] for i in inspect(engine).get_indexes("hosts")}
        assert indexes["ix_hosts_placeable"] == ["healthy", "status", "id", "updated_at"]
    finally:
        engine.dispose()
