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


def test_whether_an_image_is_private_is_an_index_lookup(database_url: str) -> None:
    """Migration 0033: clusters(image) for the clusters with registry credentials only,
    so the question every start asks (registry_auths.is_private_image) reads no
    cluster without credentials."""
    engine = make_engine(database_url)
    try:
        upgrade(engine)
        indexes = {i["name"]: i for i in inspect(engine).get_indexes("clusters")}
        index = indexes["ix_clusters_private_image"]
        assert index["column_names"] == ["image"]
        if engine.dialect.name == "sqlite":
            with engine.connect() as conn:
                plan = " ".join(
                    str(row[-1])
                    for row in conn.exec_driver_sql(
                        "EXPLAIN QUERY PLAN SELECT id FROM clusters "
                        "WHERE image = 'x' AND registry_auth_id IS NOT NULL LIMIT 1"
                    )
                )
            assert "ix_clusters_private_image" in plan, plan
    finally:
        engine.dispose()
