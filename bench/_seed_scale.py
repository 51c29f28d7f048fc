"""Fill a gpuyard database fast for the scale benchmarks (not a benchmark itself).

``seed(ctx, ...)`` writes, with bulk inserts in large batches (no API, no per-row
transaction), into a store that ``prepare_home`` migrated and bootstrapped:

- ``terminated`` clusters that lived and died over the past year, each with four
  status events (created, starting -> running, running -> terminating, terminating
  -> terminated) and its closed usage intervals: ``intervals // terminated`` of them
  in runs of five (gpu, compute, container_disk and volume while running, then the
  volume alone while stopped). The ledger totals on each row (``billed_closed``,
  ``billed_run_closed``, ``billed_run_from``; nothing open) are the sums core/billing/ledger.py
  gives for those intervals.
- ``live`` running clusters on the local host, left as a create followed by a start
  would leave them: the GPU allocation (one GPU each), the reservation, an http port
  (when the host's port range has room), the open intervals at the running rates
  (``open_rate_micro``/``open_since`` set to match) and their two status events.

Rates come from the real pricing code (services/cluster_views.cluster_rate), so the
stored amounts are what gpuyard itself would have billed. Ids come from a seeded
``random.Random``: the same arguments give the same database. Works on SQLite and
PostgreSQL (plain SQLAlchemy Core inserts).

``prepare_home(home, database_url, live)`` makes the settings of a server that can
hold ``live`` running clusters on its one (fake) host, migrates and bootstraps the
store exactly as the server's start would (so a server started later on the same
home finds its own host row), and returns the settings and the context.
"""

from __future__ import annotations

import random
import string
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import Table, insert, select

from gpuyard.core.billing.ledger import boundary, micro_rates
from gpuyard.core.models import PortSpec
from gpuyard.core.states import ClusterStatus
from gpuyard.services.catalog.gpu_types import find_gpu_type
from gpuyard.services.clusters.config import HOST_PORT
from gpuyard.services.clusters.views import cluster_rate
from gpuyard.services.context import Context
from gpuyard.services.installation.bootstrap import first_start, open_store, register_local_host
from gpuyard.services.installation.identity import ensure_installation
from gpuyard.settings import Settings
from gpuyard.store.schema import (
    Cluster,
    Event,
    GpuAllocation,
    Host,
    PortAllocation,
    Project,
    Reservation,
    UsageInterval,
)

GPU_TYPE = "NVIDIA RTX A6000"
IMAGE = "localhost/gpuyard/busybox:latest"
BATCH = 20_000
_ALPHABET = string.ascii_lowercase + string.digits
# Meters billed while running, in this order; a stopped cluster bills its volume only.
_RUNNING_METERS = ("gpu", "compute", "container_disk", "volume")
_HTTP_PORT = PortSpec(internal_port=8888, external_port=0, protocol="http")


def scale_settings(home: Path, database_url: str | None, live: int, **extra: Any) -> Settings:
    """Settings of a server whose local host holds ``live`` one-GPU clusters."""
    gpus = max(8, live)
    return Settings(
        home=home,
        database_url=database_url,
        local_gpus=f"{GPU_TYPE}:{gpus}",
        local_vcpus=max(64, 2 * live),
        local_memory_gb=max(512, 2 * live),
        local_disk_gb=max(2000, 20 * live),
        rate_limit_per_key=1e9,
        rate_limit_per_source=1e9,
        **extra,
    )


def prepare_home(home: Path, database_url: str | None, live: int) -> tuple[Settings, Context]:
    """Migrate and bootstrap the store of ``home`` as ``build_server`` does."""
    settings = scale_settings(home, database_url, live)
    _, sessions = open_store(settings)
    with sessions.begin() as session:
        ownership = ensure_installation(session)
    ctx = Context(sessions=sessions, settings=settings, ownership=ownership)
    first_start(ctx)
    register_local_host(ctx, None)
    return settings, ctx


@dataclass(frozen=True)
class Seeded:
    """What ``seed`` wrote: the live clusters' ids (newest last) and row counts."""

    live_ids: list[str]
    terminated: int
    intervals: int
    events: int
    seconds: float


def _ids(rng: random.Random, n: int, taken: set[str]) -> list[str]:
    out: list[str] = []
    while len(out) < n:
        cid = "".join(rng.choices(_ALPHABET, k=14))
        if cid not in taken:
            taken.add(cid)
            out.append(cid)
    return out


def _batches(rows: Iterator[dict[str, Any]], size: int = BATCH) -> Iterator[list[dict[str, Any]]]:
    batch: list[dict[str, Any]] = []
    for row in rows:
        batch.append(row)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def _cluster_row(cid: str, project: int, host: int, name: str, **over: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "id": cid, "project_id": project, "name": name, "image": IMAGE, "docker_args": "",
        "env": {}, "ports": [], "gpu_type": GPU_TYPE, "gpu_count": 1, "cpu_cores": 1,
        "memory_gb": 1, "container_disk_gb": 10, "volume_gb": 1,
        "volume_mount_path": "/workspace", "cloud_type": "SECURE", "interruptible": False,
        "bid_per_gpu": None, "auto_terminate": {}, "desired_status": "running",
        "status": "running", "status_reason": "running", "error_message": None,
        "startup_step": 8, "host_id": host, "gpu_indices": [], "runtime_handle": {},
        "volume_name": None, "network_volume_id": None, "restarts": 0,
        "recent_failures": [], "version": 3, "billed_closed": 0, "billed_run_closed": 0,
        "billed_run_from": None, "open_rate_micro": 0, "open_since": None,
    }  # fmt: skip
    row.update(over)
    return row


def _rates(ctx: Context) -> tuple[dict[str, int], dict[str, int]]:
    """Micro-USD/h per meter of the seeded shape, running and stopped."""
    with ctx.read() as session:
        gpu = find_gpu_type(session, GPU_TYPE)
    shape = Cluster(**_cluster_row("x" * 14, 0, 0, "shape"))
    prices = ctx.settings.prices
    running = micro_rates(cluster_rate(shape, gpu, prices, status=ClusterStatus.RUNNING))
    stopped = micro_rates(cluster_rate(shape, gpu, prices, status=ClusterStatus.STOPPED))
    return running, stopped


def _insert(ctx: Context, table: Table, rows: Iterator[dict[str, Any]]) -> int:
    n = 0
    for batch in _batches(rows):
        with ctx.transaction() as session:
            session.execute(insert(table), batch)
        n += len(batch)
    return n


def seed(
    ctx: Context,
    *,
    terminated: int = 100_000,
    intervals: int = 1_000_000,
    live: int = 1_000,
    live_ports: bool | None = None,
    seed_value: int = 16,
    now: datetime | None = None,
) -> Seeded:
    """Write the history and the live clusters (see the module docstring) into the
    admin's default project on the local host. ``live_ports`` None: an http port per
    live cluster when the port range has room for all of them."""
    t0 = time.perf_counter()
    rng = random.Random(seed_value)
    now = boundary(now or datetime.now(UTC))
    s = ctx.settings
    with ctx.read() as session:
        # The admin's default project: the first one a first start makes.
        project = session.scalar(select(Project.id).order_by(Project.id).limit(1))
        host = session.scalar(select(Host.id).where(Host.is_local.is_(True)).limit(1))
        taken = set(session.scalars(select(Cluster.id)))
    assert project is not None and host is not None
    running_rates, stopped_rates = _rates(ctx)
    per_cluster = intervals // terminated if terminated else 0
    dead_ids = _ids(rng, terminated, taken)
    live_ids = _ids(rng, live, taken)
    step = 365 * 86400 // max(1, terminated)

    # -- history ------------------------------------------------------------------------
    # Each dead cluster was created within the past year and ran in cycles (one to ten
    # hours running, then one to 48 hours stopped) until it had ``per_cluster``
    # intervals; it was terminated when the last one closed. Drawn again from the same
    # per-cluster seed for its row and for its intervals, so nothing large is held.
    def life(n: int) -> tuple[datetime, list[tuple[str, int, datetime, datetime]]]:
        r = random.Random(seed_value * 1_000_003 + n)
        created = now - timedelta(days=366) + timedelta(seconds=n * step)
        out: list[tuple[str, int, datetime, datetime]] = []
        at = created
        while len(out) < per_cluster:
            run_end = at + timedelta(seconds=r.randint(3600, 36000))
            out += [(m, rate, at, run_end) for m, rate in running_rates.items()]
            stop_end = run_end + timedelta(seconds=r.randint(3600, 48 * 3600))
            out += [(m, rate, run_end, stop_end) for m, rate in stopped_rates.items()]
            at = stop_end
        return created, out[:per_cluster]

    def last_run(ivs: list[tuple[str, int, datetime, datetime]]) -> datetime:
        """The start of the last run (its running meters' start)."""
        return max(a for m, _, a, _ in ivs if m == next(iter(running_rates)))

    def dead_clusters() -> Iterator[dict[str, Any]]:
        for n, cid in enumerate(dead_ids):
            created, ivs = life(n)
            run_from = last_run(ivs)
            closed = sum(rate * int((b - a).total_seconds()) for _, rate, a, b in ivs)
            run_closed = sum(
                rate * int((b - max(a, run_from)).total_seconds())
                for _, rate, a, b in ivs
                if b > run_from
            )
            ended = max(b for *_, b in ivs)
            yield _cluster_row(
                cid, project, host, f"old-{n}", desired_status="terminated",
                status="terminated", status_reason="terminated by user",
                start_initiated_at=run_from, started_at=run_from, stopped_at=ended,
                terminated_at=ended, created_at=created, updated_at=ended, version=8,
                billed_closed=closed, billed_run_closed=run_closed, billed_run_from=run_from,
            )  # fmt: skip

    def dead_intervals() -> Iterator[dict[str, Any]]:
        for n, cid in enumerate(dead_ids):
            for meter, rate, a, b in life(n)[1]:
                yield {"cluster_id": cid, "project_id": project, "meter": meter,
                       "gpu_type": GPU_TYPE, "rate_micro": rate, "started_at": a,
                       "ended_at": b}  # fmt: skip

    def dead_events() -> Iterator[dict[str, Any]]:
        for n, cid in enumerate(dead_ids):
            created, ivs = life(n)
            ended = max(b for *_, b in ivs)
            for at, type_, msg, a, b in (
                (created, "status", "created", None, "starting"),
                (created, "status", "running", "starting", "running"),
                (ended, "status", "terminate requested", "running", "terminating"),
                (ended, "status", "terminated", "terminating", "terminated"),
            ):
                yield {"cluster_id": cid, "created_at": at, "type": type_, "message": msg,
                       "from_status": a, "to_status": b}  # fmt: skip

    # -- live clusters --------------------------------------------------------------------
    span = s.port_range_end - s.port_range_start + 1
    with_ports = live <= span // 2 if live_ports is None else live_ports
    started_base = now - timedelta(hours=2)

    def live_started(i: int) -> datetime:
        return started_base + timedelta(seconds=i * 3600 // max(1, live))

    open_rate = sum(running_rates.values())

    def live_clusters() -> Iterator[dict[str, Any]]:
        for i, cid in enumerate(live_ids):
            at = live_started(i)
            port = s.port_range_start + i
            # As services/clusters/use_cases.py stores them: the spec plus the host port it got.
            ports = [{**_HTTP_PORT.model_dump(), HOST_PORT: port}] if with_ports else []
            yield _cluster_row(
                cid, project, host, f"live-{i}", ports=ports, gpu_indices=[i],
                start_initiated_at=at, started_at=at, created_at=at, updated_at=at,
                billed_run_from=at, open_rate_micro=open_rate, open_since=at,
            )  # fmt: skip

    def live_intervals() -> Iterator[dict[str, Any]]:
        for i, cid in enumerate(live_ids):
            for meter, rate in running_rates.items():
                yield {"cluster_id": cid, "project_id": project, "meter": meter,
                       "gpu_type": GPU_TYPE, "rate_micro": rate, "started_at": live_started(i),
                       "ended_at": None}  # fmt: skip

    def live_events() -> Iterator[dict[str, Any]]:
        for i, cid in enumerate(live_ids):
            at = live_started(i)
            yield {"cluster_id": cid, "created_at": at, "type": "status", "message": "created",
                   "from_status": None, "to_status": "starting"}  # fmt: skip
            yield {"cluster_id": cid, "created_at": at, "type": "status", "message": "running",
                   "from_status": "starting", "to_status": "running"}  # fmt: skip

    def live_gpus() -> Iterator[dict[str, Any]]:
        for i, cid in enumerate(live_ids):
            yield {"host_id": host, "gpu_index": i, "cluster_id": cid}

    def live_reservations() -> Iterator[dict[str, Any]]:
        for cid in live_ids:
            yield {"cluster_id": cid, "host_id": host, "vcpus": 1, "memory_gb": 1,
                   "container_disk_gb": 10, "volume_gb": 1}  # fmt: skip

    def live_ports_rows() -> Iterator[dict[str, Any]]:
        if not with_ports:
            return
        for i, cid in enumerate(live_ids):
            yield {"host_id": host, "port": s.port_range_start + i, "protocol": "tcp",
                   "cluster_id": cid, "internal_port": 8888}  # fmt: skip

    _insert(ctx, Cluster.__table__, dead_clusters())  # type: ignore[arg-type]
    n_intervals = _insert(ctx, UsageInterval.__table__, dead_intervals())  # type: ignore[arg-type]
    n_events = _insert(ctx, Event.__table__, dead_events())  # type: ignore[arg-type]
    _insert(ctx, Cluster.__table__, live_clusters())  # type: ignore[arg-type]
    n_intervals += _insert(ctx, UsageInterval.__table__, live_intervals())  # type: ignore[arg-type]
    n_events += _insert(ctx, Event.__table__, live_events())  # type: ignore[arg-type]
    _insert(ctx, GpuAllocation.__table__, live_gpus())  # type: ignore[arg-type]
    _insert(ctx, Reservation.__table__, live_reservations())  # type: ignore[arg-type]
    _insert(ctx, PortAllocation.__table__, live_ports_rows())  # type: ignore[arg-type]
    return Seeded(live_ids, terminated, n_intervals, n_events, time.perf_counter() - t0)


def write_running(path: Path, ids: Sequence[str]) -> None:
    """The ids a fake engine should list as running (bench/_scale_server.py)."""
    path.write_text("\n".join(ids) + "\n")
