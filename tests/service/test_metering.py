"""The usage ledger on a real database: what each status bills, runs, splits, crashes."""

from __future__ import annotations

from sqlalchemy import select

from gpuyard.core.billing.ledger import Accrual, Interval, micro, total_amount
from gpuyard.reconciler.loop import Reconciler
from gpuyard.reconciler.wiring import build_reconciler
from gpuyard.services.billing import metering
from gpuyard.services.clock import FakeClock
from gpuyard.services.clusters import use_cases as uc
from gpuyard.services.clusters.requests import CreateCluster, StartCluster
from gpuyard.services.context import Context
from gpuyard.services.tenancy.auth import Principal
from gpuyard.store.migrate import downgrade, upgrade
from gpuyard.store.schema import Cluster, UsageInterval
from gpuyard.testing.fake_runtime import FakeRuntime
from tests.helpers import assert_totals_match_history

A = "NVIDIA RTX A6000"


def body(**kw: object) -> CreateCluster:
    return CreateCluster.model_validate(
        {"gpu_type": A, "docker_image": "img", "volume_gb": 50, **kw}
    )


def settle(rec: Reconciler, cid: str) -> None:
    for _ in range(3):
        rec.driver.drive(cid)


def rate(ctx: Context, cid: str) -> int:
    with ctx.read() as session:
        return metering.current_rate_micro(session, cid)


def running_rate(ctx: Context, cid: str, running: bool = True) -> int:
    with ctx.read() as session:
        c = uc.load_cluster(session, _any(ctx, cid), cid)
        return micro(uc.rate_of(session, c, ctx, running=running).total)


def _any(ctx: Context, cid: str) -> Principal:
    return _OWNER[cid]


_OWNER: dict[str, Principal] = {}


def create(ctx: Context, p: Principal, **kw: object) -> str:
    cid = uc.create_cluster(ctx, p, body(**kw)).id
    _OWNER[cid] = p
    return cid


def accrued(ctx: Context, cid: str) -> Accrual:
    with ctx.read() as session:
        return metering.accrued(session, cid, ctx.clock.now())


def intervals(ctx: Context, cid: str) -> list[UsageInterval]:
    with ctx.read() as session:
        return list(
            session.scalars(
                select(UsageInterval)
                .where(UsageInterval.cluster_id == cid)
                .order_by(UsageInterval.id)
            )
        )


def test_each_status_bills_its_parts(
    ctx: Context, alice: Principal, rec: Reconciler, clock: FakeClock
) -> None:
    cid = create(ctx, alice)
    full, stopped = running_rate(ctx, cid), running_rate(ctx, cid, running=False)
    assert full > stopped > 0
    assert rate(ctx, cid) == full  # starting bills everything
    settle(rec, cid)
    assert uc.get_cluster(ctx, alice, cid).status == "running" and rate(ctx, cid) == full
    uc.stop_cluster(ctx, alice, cid)
    assert rate(ctx, cid) == stopped  # billing of compute ends at the stop request
    settle(rec, cid)
    assert uc.get_cluster(ctx, alice, cid).status == "stopped" and rate(ctx, cid) == stopped
    meters = {iv.meter for iv in intervals(ctx, cid) if iv.ended_at is None}
    assert meters == {"volume"}
    uc.terminate_cluster(ctx, alice, cid)
    assert rate(ctx, cid) == 0
    settle(rec, cid)
    assert all(iv.ended_at is not None for iv in intervals(ctx, cid))


def test_stop_start_resets_the_current_run(
    ctx: Context, alice: Principal, rec: Reconciler, clock: FakeClock
) -> None:
    cid = create(ctx, alice)
    full, stopped = running_rate(ctx, cid), running_rate(ctx, cid, running=False)
    settle(rec, cid)
    clock.advance(3600)
    uc.stop_cluster(ctx, alice, cid)
    settle(rec, cid)
    clock.advance(1800)
    # The run since the last start: 1 h running, then the volume while stopped.
    assert accrued(ctx, cid).current_run_micro == (full * 3600 + stopped * 1800) // 3600
    uc.start_cluster(ctx, alice, cid, StartCluster())
    settle(rec, cid)
    clock.advance(900)
    a = accrued(ctx, cid)
    assert a.current_run_micro == full // 4
    assert a.lifetime_micro == (full * 3600 + stopped * 1800 + full * 900) // 3600
    with ctx.read() as session:
        assert metering.run_accrued_micro(session, cid, clock.now()) == full // 4


def test_a_rate_change_at_start_splits_the_interval(
    ctx: Context, alice: Principal, rec: Reconciler, clock: FakeClock
) -> None:
    cid = create(ctx, alice)
    one = running_rate(ctx, cid)
    settle(rec, cid)
    clock.advance(600)
    uc.stop_cluster(ctx, alice, cid)
    settle(rec, cid)
    result = uc.start_cluster(
        ctx, alice, cid, StartCluster.model_validate({"update_configuration": {"gpu_count": 2}})
    )
    two = micro(result.new_rate)
    assert two > one and rate(ctx, cid) == two
    clock.advance(600)
    gpu = [iv for iv in intervals(ctx, cid) if iv.meter == "gpu"]
    assert len(gpu) == 2 and gpu[1].rate_micro == 2 * gpu[0].rate_micro
    assert gpu[0].ended_at is not None and gpu[1].started_at >= gpu[0].ended_at
    assert accrued(ctx, cid).current_run_micro == two * 600 // 3600


def test_a_preempted_spot_cluster_stops_paying_for_gpus(
    ctx: Context, alice: Principal, rec: Reconciler, clock: FakeClock
) -> None:
    spot = create(ctx, alice, gpu_count=4, interruptible=True, bid_per_gpu=0.3)
    settle(rec, spot)
    assert {iv.rate_micro for iv in intervals(ctx, spot) if iv.meter == "gpu"} == {1_200_000}
    clock.advance(100)
    create(ctx, alice, gpu_count=1)  # on demand: outbids the spot cluster
    assert uc.get_cluster(ctx, alice, spot).status == "stopping"
    open_meters = {iv.meter for iv in intervals(ctx, spot) if iv.ended_at is None}
    assert open_meters == {"volume"}
    clock.advance(100)
    gpu_seconds = sum(
        (iv.ended_at - iv.started_at).total_seconds()
        for iv in intervals(ctx, spot)
        if iv.meter == "gpu" and iv.ended_at
    )
    assert gpu_seconds == 100


def test_a_crash_leaves_open_intervals_running_and_never_doubles(
    ctx: Context, alice: Principal, runtime: FakeRuntime, clock: FakeClock
) -> None:
    cid = create(ctx, alice)
    full = running_rate(ctx, cid)
    build_reconciler(ctx, runtime).driver.drive(cid)
    clock.advance(1234.7)
    # The server dies; a new process (new reconciler and driver) carries on.
    settle(build_reconciler(ctx, runtime), cid)
    clock.advance(1000)
    settle(build_reconciler(ctx, runtime), cid)
    open_ = [iv for iv in intervals(ctx, cid) if iv.ended_at is None]
    assert len(open_) == len({iv.meter for iv in open_})  # one open interval per meter
    assert accrued(ctx, cid).lifetime_micro == full * 2234 // 3600


def test_the_bill_groups_and_clips(
    ctx: Context, alice: Principal, bob: Principal, rec: Reconciler, clock: FakeClock
) -> None:
    start = clock.now()
    cid = create(ctx, alice)
    full = running_rate(ctx, cid)
    settle(rec, cid)
    clock.advance(86400 + 3600)  # into the second day
    with ctx.read() as session:
        by_day = metering.bill(
            session, alice.account_id, None, start, clock.now(), metering.GroupBy.DAY, clock.now()
        )
        by_gpu = metering.bill(
            session,
            alice.account_id,
            None,
            start,
            clock.now(),
            metering.GroupBy.GPU_TYPE,
            clock.now(),
        )
        nothing = metering.bill(
            session, bob.account_id, None, start, clock.now(), metering.GroupBy.CLUSTER, clock.now()
        )
    assert [line.micro for line in by_day.lines] == [full * 24, full]
    assert [line.key for line in by_gpu.lines] == [A]
    assert by_gpu.total_micro == full * 25 and by_gpu.lines[0].gpu_seconds == 25 * 3600
    assert nothing.lines == []


def test_ledger_arithmetic_is_exact() -> None:
    from datetime import UTC, datetime, timedelta

    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    ivs = [
        Interval("gpu", 790_000, t0, t0 + timedelta(seconds=7)),
        Interval("gpu", 790_000, t0 + timedelta(seconds=7), None),
    ]
    now = t0 + timedelta(seconds=20, microseconds=999_999)
    assert total_amount(ivs, now) == 790_000 * 20
    assert total_amount(ivs, now, since=t0 + timedelta(seconds=5)) == 790_000 * 15


def test_migration_0011_backfills_the_totals_from_history(
    ctx: Context, alice: Principal, clock: FakeClock
) -> None:
    """A database with history from before the running totals gets them from its
    intervals when it upgrades: the cost it shows does not change."""
    rec = build_reconciler(ctx, FakeRuntime())
    ids = [create(ctx, alice), create(ctx, alice, gpu_count=2)]
    for cid in ids:
        settle(rec, cid)
    clock.advance(3600.4)
    uc.stop_cluster(ctx, alice, ids[0])
    settle(rec, ids[0])
    clock.advance(600)
    uc.start_cluster(ctx, alice, ids[0], StartCluster())
    clock.advance(95)
    engine = ctx.sessions.kw["bind"]
    downgrade(engine, "0010")
    upgrade(engine)
    for cid in ids:
        assert_totals_match_history(ctx, cid)
    with ctx.read() as session:
        restarted = session.get(Cluster, ids[0])
        assert restarted is not None and restarted.billed_closed > 0
        assert restarted.billed_run_closed == 0 and restarted.open_rate_micro > 0
