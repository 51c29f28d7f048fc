"""Ledger property: for any sequence of create/start/stop/rate change/crash/clock
advance, the billed amount equals the integral of the rate over time, computed here
independently from the statuses the clusters went through, and the running totals on
the cluster row give the same cost as its whole interval history."""

from __future__ import annotations

import contextlib
from datetime import datetime

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuyard.core.billing.ledger import accrue_totals, boundary, micro, total_amount
from gpuyard.core.billing.pricing import hourly_rate
from gpuyard.core.errors import GpuyardError
from gpuyard.core.models import CloudType
from gpuyard.reconciler.wiring import build_reconciler
from gpuyard.services.billing import metering
from gpuyard.services.billing.ledger_totals import totals
from gpuyard.services.catalog.gpu_types import find_gpu_type
from gpuyard.services.clock import FakeClock
from gpuyard.services.clusters import use_cases as uc
from gpuyard.services.clusters.requests import CreateCluster, StartCluster
from gpuyard.services.context import Context
from gpuyard.services.tenancy.auth import Principal
from gpuyard.store.schema import Cluster
from gpuyard.testing.fake_runtime import FakeRuntime

A = "NVIDIA RTX A6000"
COMPUTE = {"pending", "starting", "running"}
NOTHING = {"terminating", "terminated"}

ops = st.lists(
    st.one_of(
        st.just(("create", 0)),
        st.tuples(st.just("start"), st.integers(1, 2)),  # with a GPU count (rate change)
        st.just(("stop", 0)),
        st.just(("drive", 0)),
        st.just(("crash", 0)),
        st.tuples(st.just("advance"), st.integers(1, 10_000_000)),  # microseconds x 1000
    ),
    max_size=25,
)


def expected_rate(ctx: Context, status: str, gpu_count: int) -> int:
    if status in NOTHING:
        return 0
    with ctx.read() as session:
        gpu = find_gpu_type(session, A)
    parts = hourly_rate(
        gpu=gpu,
        gpu_count=gpu_count,
        cpu_cores=4,
        memory_gb=16,
        container_disk_gb=20,
        volume_gb=30,
        cloud_type=CloudType.SECURE,
        running=status in COMPUTE,
        prices=ctx.settings.prices,
    )
    return sum(micro(p) for p in (parts.gpu, parts.compute, parts.container_disk, parts.volume))


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(steps=ops)
def test_billed_equals_the_integral(
    ctx: Context, alice: Principal, clock: FakeClock, steps: list[tuple[str, int]]
) -> None:
    runtime = FakeRuntime()
    rec = build_reconciler(ctx, runtime)
    # Per cluster: (status, gpu count, rate, since) of the segment now open, and the sum.
    seen: dict[str, tuple[str, int, int, datetime]] = {}
    integral: dict[str, int] = {}

    def observe() -> None:
        now = clock.now()
        for cid, (status, gpus, rate, since) in list(seen.items()):
            c = uc.get_cluster(ctx, alice, cid)
            if c.status == status and c.gpu_count == gpus:
                continue
            seconds = int((boundary(now) - boundary(since)).total_seconds())
            integral[cid] += rate * seconds
            seen[cid] = (c.status, c.gpu_count, expected_rate(ctx, c.status, c.gpu_count), now)

    body = CreateCluster.model_validate(
        {
            "gpu_type": A,
            "docker_image": "img",
            "cpu_cores": 4,
            "memory_gb": 16,
            "container_disk_gb": 20,
            "volume_gb": 30,
        }
    )
    for op, arg in steps:
        ids = list(seen)
        try:
            if op == "create" and len(ids) < 2:
                cid = uc.create_cluster(ctx, alice, body).id
                seen[cid] = ("starting", 1, expected_rate(ctx, "starting", 1), clock.now())
                integral[cid] = 0
            elif op == "start" and ids:
                upd = {"update_configuration": {"gpu_count": arg}}
                uc.start_cluster(ctx, alice, ids[-1], StartCluster.model_validate(upd))
            elif op == "stop" and ids:
                uc.stop_cluster(ctx, alice, ids[0])
            elif op == "drive":
                for cid in ids:
                    rec.driver.drive(cid)
            elif op == "crash":
                rec = build_reconciler(ctx, FakeRuntime())  # a new process: nothing in memory
            elif op == "advance":
                clock.advance(arg / 1000)
        except GpuyardError:
            pass  # not allowed in this status, or no capacity: nothing may change
        observe()
    now = clock.now()
    with ctx.read() as session:
        for cid in seen:
            _, _, rate, since = seen[cid]
            exact = integral[cid] + rate * int((boundary(now) - boundary(since)).total_seconds())
            billed = total_amount(metering.load_intervals(session, [cid])[cid], now)
            assert billed == exact
            # The running totals on the row answer what the whole history answers.
            row = session.get(Cluster, cid)
            assert row is not None
            from_history = metering.accrued(session, cid, now)
            assert accrue_totals(totals(row), now, row.start_initiated_at, row.created_at) == (
                from_history
            )
    for cid in seen:  # free the host for the next example
        with contextlib.suppress(GpuyardError):
            uc.terminate_cluster(ctx, alice, cid)
        for _ in range(3):
            rec.driver.drive(cid)
