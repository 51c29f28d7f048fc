"""Replicas starting together on one fresh PostgreSQL database: migrations run once
(under the start-up lock), seeding adds no duplicates, exactly one of them creates
the admin key, and none fails."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import func, select, text

from gpuyard.core.catalog import SEED_GPU_TYPES
from gpuyard.store.db import make_engine
from gpuyard.store.schema import ApiKey, GpuType, Host, Installation, Plan, User
from tests.conftest import PG_URL, _pg_database

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def pg_url() -> Iterator[str]:
    if not PG_URL:
        pytest.skip("GPUYARD_TEST_POSTGRES_URL not set (make test starts PostgreSQL)")
    yield from _pg_database()


# One replica's start-up, as ``gpuyard serve`` does it (without the HTTP server):
# prints whether it created the admin key and its installation id.
_START = """
import json, sys, time
from pathlib import Path
from gpuyard.api.app import build_server
from gpuyard.testing.fake_runtime import FakeRuntime
from tests.helpers import make_settings
settings = make_settings(Path(sys.argv[1]), sys.argv[2])
go = Path(sys.argv[3])
while not go.exists():
    time.sleep(0.01)
server = build_server(settings, FakeRuntime(), run_reconciler=False)
print(json.dumps([server.admin_key is not None, server.ctx.ownership.installation_id]))
"""


@pytest.mark.parametrize("replicas", [2, 4])
def test_replicas_starting_together_migrate_and_seed_once(
    pg_url: str, tmp_path: Path, replicas: int
) -> None:
    # One machine, one home (shared secret key and host id), as replicas on one host;
    # separate processes (Alembic keeps per-run state in module globals).
    go = tmp_path / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _START, str(tmp_path / "home"), pg_url, str(go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        for _ in range(replicas)
    ]
    time.sleep(1.5)  # let them import, then start them at once
    go.touch()
    results = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise AssertionError("a replica's start-up hung") from None
        assert proc.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert sum(created for created, _ in results) == 1
    assert len({installation for _, installation in results}) == 1
    engine = make_engine(pg_url)
    try:
        with engine.connect() as conn:

            def count(model: type) -> int:
                return int(conn.scalar(select(func.count()).select_from(model)) or 0)

            assert count(Installation) == 1
            assert count(User) == 1 and count(ApiKey) == 1
            assert count(GpuType) == len(SEED_GPU_TYPES)
            plans = conn.execute(select(Plan.gpu_type, Plan.gpus_per_node)).all()
            assert plans and len(plans) == len(set(plans))
            assert count(Host) == 1
            versions = conn.execute(text("SELECT version_num FROM alembic_version")).all()
            assert len(versions) == 1
    finally:
        engine.dispose()
