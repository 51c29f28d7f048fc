"""gpuyard on a highly available PostgreSQL (Patroni, synchronous replication) while
the primary fails over.

Two ``gpuyard serve`` replicas share a two-node Patroni cluster through the multi-host
URL of the operator's guide (``target_session_attrs=read-write``). Fifty creates are in
flight through both replicas when the leader node crashes: SIGKILL to its Patroni and
its postmaster. (A postmaster-only kill does not fail over: the surviving Patroni
restarts PostgreSQL in place, shared/notes/ha-postgresql-on-one-machine.md; a crashed
node is the failure a failover exists for.) Patroni promotes the synchronous replica.

What must hold:
- while the database is away, requests are answered 503 DATABASE_UNAVAILABLE in the
  envelope (with Retry-After), never a 500; both replicas answer again within 30 s of
  the crash, without a restart;
- a create whose outcome the client never saw (its COMMIT cut off, or its answer lost)
  is retried with the same Idempotency-Key until answered, as a client should: every
  one of the 50 is answered 201 in the end, and exactly 50 clusters exist, each with
  exactly one container, no GPU allocated twice;
- the duty leases change holder only with a new fence: sampled through the failover,
  a lease's fence never goes back and no fence has two holders.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import docker
import httpx
import pytest
from sqlalchemy import Engine, select
from sqlalchemy.exc import SQLAlchemyError

from gpuyard.core.ownership import LABEL_INSTALLATION
from gpuyard.store.db import make_engine
from gpuyard.store.schema import Cluster, GpuAllocation, Installation, Lease
from tests.e2e.conftest import DEV_IMAGE, purge_installation
from tests.e2e.patroni_cluster import PatroniCluster, unavailable_reason
from tests.e2e.replica_process import Replica, eventually
from tests.required_parts import need

pytestmark = pytest.mark.e2e

CREATES = 50
WORKERS = 10
# Creates answered before the crash: the rest are in flight or still to be sent.
ANSWERED_BEFORE_CRASH = 10
LEASE_TTL_S = 6.0
ANSWER_AGAIN_S = 30.0


@pytest.fixture
def patroni() -> Iterator[PatroniCluster]:
    need(
        "a Patroni cluster",
        unavailable_reason(),
        how="WITH_POSTGRES=1 bash scripts/setup-system.sh",
    )
    cluster = PatroniCluster()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()


@pytest.fixture
def replicas(tmp_path: Path, engine_url: str, patroni: PatroniCluster) -> Iterator[list[Replica]]:
    home = tmp_path / "home"
    made = [
        Replica(n, home, engine_url, patroni.url(), gpus=CREATES + 14, lease_ttl_s=LEASE_TTL_S)
        for n in ("a", "b")
    ]
    try:
        for r in made:
            r.start()
        for r in made:
            r.wait_up()
        yield made
    finally:
        for r in made:
            r.stop()
        installations: list[str] = []
        db = make_engine(patroni.url())
        try:
            with db.connect() as conn:
                installations = list(conn.scalars(select(Installation.uuid)))
        except SQLAlchemyError:
            pass
        finally:
            db.dispose()
        for installation_id in installations:
            purge_installation(engine_url, installation_id)


@dataclass
class Outcome:
    """What one create's client saw: every answer until the 201."""

    name: str
    statuses: list[int] = field(default_factory=list)
    refusals: list[str] = field(default_factory=list)  # non-201 answers' bodies
    cluster_id: str | None = None


def create_until_answered(client: httpx.Client, name: str, deadline: float) -> Outcome:
    """POST the create with one Idempotency-Key until it is answered 201 (a client's
    retry of an unknown outcome); every answer is recorded."""
    out = Outcome(name)
    key = str(uuid.uuid4())
    body = {
        "name": name,
        "gpu_type": "NVIDIA RTX A6000",
        "gpu_count": 1,
        "docker_image": DEV_IMAGE,
        "volume_gb": 1,
        "memory_gb": 1,
        "cpu_cores": 1,
    }
    while time.monotonic() < deadline:
        try:
            r = client.post("/v1/clusters", json=body, headers={"Idempotency-Key": key})
        except httpx.TransportError as e:
            out.statuses.append(0)
            out.refusals.append(repr(e))
            time.sleep(0.5)
            continue
        out.statuses.append(r.status_code)
        if r.status_code == 201:
            out.cluster_id = r.json()["data"]["id"]
            return out
        out.refusals.append(r.text)
        if r.status_code != 503:
            return out  # not a retryable answer: the assertions below show it
        time.sleep(min(float(r.headers.get("Retry-After", "1")), 2.0))
    return out


class LeaseWatch:
    """Samples the lease rows (name, holder, fence) through the failover."""

    def __init__(self, db: Engine) -> None:
        self.db = db
        self.samples: list[tuple[str, str, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> LeaseWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            try:
                with self.db.connect() as conn:
                    rows = conn.execute(select(Lease.name, Lease.holder, Lease.fence)).all()
            except SQLAlchemyError:
                continue  # the database is away: nothing to see
            self.samples.extend((n, h, int(f)) for n, h, f in rows)

    def check(self) -> None:
        """A lease's fence never goes back; each fence has one holder."""
        last: dict[str, int] = {}
        holders: dict[tuple[str, int], set[str]] = {}
        for name, holder, fence in self.samples:
            assert fence >= last.get(name, 0), (name, fence, last.get(name))
            last[name] = fence
            holders.setdefault((name, fence), set()).add(holder)
        two = {k: v for k, v in holders.items() if len(v) > 1}
        assert not two, two
        assert last, "no lease was ever seen"


def answers(replica: Replica) -> bool | None:
    """True once the replica answers an authenticated read from the database."""
    try:
        with replica.client(timeout=5) as c:
            return True if c.get("/v1/clusters").status_code == 200 else None
    except httpx.HTTPError:
        return None


def test_creates_survive_a_primary_failover(
    replicas: list[Replica], patroni: PatroniCluster, engine_url: str
) -> None:
    a, b = replicas
    db = make_engine(patroni.url())
    engine = docker.DockerClient(base_url=engine_url)
    clients = [a.client(), b.client()]
    try:
        old_leader = patroni.leader()
        assert old_leader is not None
        answered = threading.Semaphore(0)
        deadline = time.monotonic() + 120

        def one(i: int) -> Outcome:
            out = create_until_answered(clients[i % 2], f"ha-{i}", deadline)
            answered.release()
            return out

        with LeaseWatch(db) as leases, ThreadPoolExecutor(WORKERS) as pool:
            futures = [pool.submit(one, i) for i in range(CREATES)]
            for _ in range(ANSWERED_BEFORE_CRASH):
                assert answered.acquire(timeout=120), "creates are not answered"
            patroni.crash(old_leader)
            crashed_at = time.monotonic()
            # Both replicas answer again, without a restart, once Patroni has promoted.
            for r in replicas:
                left = ANSWER_AGAIN_S - (time.monotonic() - crashed_at)
                eventually(lambda r=r: answers(r), max(left, 0), f"{r.name} to answer again")
            outcomes = [f.result() for f in futures]
            new_leader = patroni.leader()
            assert new_leader is not None and new_leader is not old_leader, patroni.members()
            time.sleep(LEASE_TTL_S)  # leases taken again after the outage are sampled
        leases.check()

        for r in replicas:  # (neither was restarted)
            assert r.proc is not None and r.proc.poll() is None, r.tail()
        statuses = Counter(s for o in outcomes for s in o.statuses)
        # Only 201 or 503 (never a 500, never a dropped connection); and some 503s:
        # the crash met creates in flight.
        assert set(statuses) <= {201, 503}, (statuses, [o.refusals for o in outcomes])
        assert statuses[503] > 0, statuses
        for o in outcomes:
            for text in o.refusals:
                assert '"code":"DATABASE_UNAVAILABLE"' in text.replace(" ", ""), text
        unanswered = [o for o in outcomes if o.cluster_id is None]
        assert not unanswered, unanswered
        ids = {o.cluster_id for o in outcomes}
        assert len(ids) == CREATES

        with db.connect() as conn:
            rows = conn.execute(select(Cluster.id, Cluster.name)).all()
            gpus = conn.execute(select(GpuAllocation.cluster_id)).all()
            installation = conn.scalar(select(Installation.uuid))
        assert {cid for cid, _ in rows} == ids, rows  # no cluster made twice, none lost
        per_cluster = Counter(cid for (cid,) in gpus)
        assert all(per_cluster[cid] == 1 for cid in ids), per_cluster

        def one_container_each() -> bool | None:
            # Sparse: the list alone, no inspect of each (a container being replaced
            # may be gone by then).
            ours = engine.containers.list(
                all=True, sparse=True, filters={"label": f"{LABEL_INSTALLATION}={installation}"}
            )
            found = Counter((c.attrs.get("Labels") or {}).get("gpuyard.cluster_id") for c in ours)
            assert all(n <= 1 for n in found.values()), found
            return True if all(found[cid] == 1 for cid in ids) else None

        eventually(one_container_each, 120, "one container per cluster")
        # No request failed unexpectedly (errors.py logs "unhandled error" for those).
        assert "unhandled error" not in a.tail(500_000) + b.tail(500_000)
    finally:
        for c in clients:
            c.close()
        engine.close()
        db.dispose()
