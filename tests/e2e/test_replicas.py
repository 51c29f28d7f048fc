"""Two ``gpuyard serve`` replicas on one PostgreSQL database and one real Podman engine.

Clusters are created through both; the replica holding the duty leases is killed
with SIGKILL while clusters are starting; the survivor takes the leases over once
they expire and every cluster converges to ``running``. No duty runs twice: no
cluster reaches ``running`` twice without a stop between, its usage intervals never
overlap for one meter, and the engine holds one container per cluster.

Each test gets a fresh database on the test PostgreSQL server
(``GPUYARD_TEST_POSTGRES_URL``; ``bash scripts/test-postgres.sh`` starts one). The
replicas share one home (one machine: its secret key and host id) and the engine; what
the installation made is removed by its installation id only.
"""

from __future__ import annotations

import itertools
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest
from sqlalchemy import Engine, func, select

from gpuyard.core.ownership import LABEL_INSTALLATION
from gpuyard.store.db import make_engine
from gpuyard.store.schema import Cluster, Event, Installation, Lease, UsageInterval
from tests.conftest import PG_URL, _pg_database
from tests.e2e.conftest import DEV_IMAGE, purge_installation
from tests.e2e.replica_process import Replica, eventually

pytestmark = pytest.mark.e2e

if shutil.which("podman") is None:
    pytest.skip("podman is not installed (apt-get install podman)", allow_module_level=True)

# Short leases keep the test short; the mechanism is the one of the 15 s default.
LEASE_TTL_S = 6.0
CLUSTERS_PER_REPLICA = 3


def lease_holders(db: Engine) -> dict[str, str]:
    """Lease name -> holder, for the leases held now by the database's clock."""
    with db.connect() as conn:
        rows = conn.execute(
            select(Lease.name, Lease.holder).where(
                Lease.expires_at > func.timezone("UTC", func.now())
            )
        ).all()
    return {name: holder for name, holder in rows}


def holder_pid(holder: str) -> int:
    """The pid in a replica id (services/installation/replica.py: ``host:pid:uuid``)."""
    return int(holder.rsplit(":", 2)[1])


def engine_duty_holder(db: Engine) -> str | None:
    """The holder of the engine duty (``engine:local`` for one shared engine, or the
    local host's ``host:<id>``): the replica that drives cluster starts."""
    held = lease_holders(db)
    engine_leases = [h for n, h in held.items() if n.startswith(("engine:", "host:"))]
    return engine_leases[0] if engine_leases else None


@pytest.fixture
def database_url() -> Iterator[str]:
    if not PG_URL:
        pytest.skip("GPUYARD_TEST_POSTGRES_URL not set (bash scripts/test-postgres.sh)")
    yield from _pg_database()


@pytest.fixture
def replicas(tmp_path: Path, engine_url: str, database_url: str) -> Iterator[list[Replica]]:
    home = tmp_path / "home"
    made = [
        Replica(
            n,
            home,
            engine_url,
            database_url,
            gpus=2 * CLUSTERS_PER_REPLICA,
            lease_ttl_s=LEASE_TTL_S,
        )
        for n in ("a", "b")
    ]
    db = make_engine(database_url)
    try:
        # Started together: migrations, seeding and the admin key happen once.
        for r in made:
            r.start()
        for r in made:
            r.wait_up()
        yield made
    finally:
        for r in made:
            r.stop()
        with db.connect() as conn:
            installations = list(conn.scalars(select(Installation.uuid)))
        db.dispose()
        for installation_id in installations:
            purge_installation(engine_url, installation_id)


def test_kill_the_lease_holder_while_clusters_start(
    replicas: list[Replica], database_url: str, engine_url: str
) -> None:
    a, b = replicas
    # Exactly one of the two created the admin key; the other started without one.
    logs = a.tail() + b.tail()
    assert logs.count("an admin API key was created") == 1, logs
    assert "Traceback" not in logs, logs
    db = make_engine(database_url)
    engine = docker.DockerClient(base_url=engine_url)
    try:
        holder = eventually(lambda: engine_duty_holder(db), 30, "a replica to take the duties")
        victim, survivor = (a, b) if holder_pid(holder) == a.pid else (b, a)
        assert holder_pid(holder) == victim.pid, (holder, a.pid, b.pid)

        # Created through both replicas, alternating.
        ids: list[str] = []
        clients = [a.client(), b.client()]
        for c in itertools.islice(itertools.cycle(clients), 2 * CLUSTERS_PER_REPLICA):
            r = c.post(
                "/v1/clusters",
                json={
                    "name": f"replica-{len(ids)}",
                    "gpu_type": "NVIDIA RTX A6000",
                    "gpu_count": 1,
                    "docker_image": DEV_IMAGE,
                    "volume_gb": 1,
                    "memory_gb": 1,
                    "cpu_cores": 1,
                },
            )
            assert r.status_code == 201, r.text
            ids.append(r.json()["data"]["id"])
        with db.connect() as conn:
            at_kill = dict(conn.execute(select(Cluster.id, Cluster.status)).all())
        victim.kill9()
        killed_at = time.monotonic()
        # The scenario needs work in flight when the holder dies.
        assert any(s != "running" for s in at_kill.values()), at_kill

        def survivor_holds() -> str | None:
            h = engine_duty_holder(db)
            return h if h is not None and holder_pid(h) == survivor.pid else None

        eventually(survivor_holds, LEASE_TTL_S + 15, "the survivor to take the duties over")
        taken_after = time.monotonic() - killed_at
        assert taken_after < LEASE_TTL_S + 10, taken_after  # (a loaded machine: slack)

        def all_running() -> bool | None:
            with db.connect() as conn:
                rows = dict(conn.execute(select(Cluster.id, Cluster.status)).all())
            bad = {cid: s for cid, s in rows.items() if s == "error"}
            assert not bad, (bad, survivor.tail())
            return True if all(rows[cid] == "running" for cid in ids) else None

        eventually(all_running, 180, "every cluster to run")
        time.sleep(2)  # a duty running twice would show in the next passes

        with db.connect() as conn:
            events = conn.execute(
                select(Event.cluster_id, Event.to_status).order_by(Event.id)
            ).all()
            intervals = conn.execute(
                select(
                    UsageInterval.cluster_id,
                    UsageInterval.meter,
                    UsageInterval.started_at,
                    UsageInterval.ended_at,
                ).order_by(UsageInterval.started_at, UsageInterval.id)
            ).all()
            installation = conn.scalar(select(Installation.uuid))
        for cid in ids:
            statuses = [s for c, s in events if c == cid and s is not None]
            assert statuses.count("running") >= 1, statuses
            for s1, s2 in itertools.pairwise([s for s in statuses if s in ("running", "stopped")]):
                assert not (s1 == s2 == "running"), f"{cid} started twice: {statuses}"
            by_meter: dict[str, list[tuple[Any, Any]]] = {}
            for c, meter, start, end in intervals:
                if c == cid:
                    by_meter.setdefault(meter, []).append((start, end))
            for meter, spans in by_meter.items():
                assert sum(end is None for _, end in spans) <= 1, (cid, meter, spans)
                for (_, end1), (start2, _) in itertools.pairwise(spans):
                    assert end1 is not None and end1 <= start2, (cid, meter, spans)
        # One container per cluster on the shared engine, each running.
        ours = engine.containers.list(
            all=True, filters={"label": f"{LABEL_INSTALLATION}={installation}"}
        )
        per_cluster: dict[str, list[str]] = {}
        for container in ours:
            cid = container.labels.get("gpuyard.cluster_id", "")
            per_cluster.setdefault(cid, []).append(container.status)
        for cid in ids:
            assert per_cluster.get(cid) == ["running"], (cid, per_cluster)
        # The survivor still serves the clusters created through the dead replica.
        with survivor.client() as c:
            for cid in ids:
                assert c.get(f"/v1/clusters/{cid}").json()["data"]["status"] == "running"
        for c in clients:
            c.close()
    finally:
        engine.close()
        db.dispose()
