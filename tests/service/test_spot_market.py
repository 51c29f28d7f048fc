"""The spot market on a real database: preemption order, bids, volumes kept."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import select

from gpuyard.core.errors import InsufficientCapacity, ValidationFailed
from gpuyard.core.models import CloudType
from gpuyard.reconciler.loop import Reconciler
from gpuyard.services.billing import spot
from gpuyard.services.clusters import use_cases as uc
from gpuyard.services.clusters.requests import CreateCluster, StartCluster
from gpuyard.services.context import Context
from gpuyard.services.tenancy.auth import Principal
from gpuyard.store.schema import GpuAllocation, Host
from gpuyard.testing.fake_runtime import FakeRuntime

A = "NVIDIA RTX A6000"  # the test host has 4, spot floor 0.20 (secure)


def spot_body(n: int, bid: float | None, **kw: object) -> CreateCluster:
    body: dict[str, object] = {"gpu_type": A, "gpu_count": n, "docker_image": "img", **kw}
    if bid is not None:
        body.update(interruptible=True, bid_per_gpu=bid)
    return CreateCluster.model_validate(body)


def settle(rec: Reconciler, *ids: str) -> None:
    for _ in range(3):
        for cid in ids:
            rec.driver.drive(cid)


def fill_with_bids(ctx: Context, p: Principal, rec: Reconciler) -> dict[float, str]:
    ids = {bid: uc.create_cluster(ctx, p, spot_body(1, bid)).id for bid in (0.40, 0.50, 0.60, 0.70)}
    settle(rec, *ids.values())
    return ids


def test_bid_below_floor_is_refused(ctx: Context, alice: Principal) -> None:
    with pytest.raises(ValidationFailed) as exc:
        uc.create_cluster(ctx, alice, spot_body(1, 0.10))
    assert exc.value.details == {"field": "bid_per_gpu", "minimum": 0.2}


def test_on_demand_preempts_the_lowest_bid(ctx: Context, alice: Principal, rec: Reconciler) -> None:
    ids = fill_with_bids(ctx, alice, rec)
    winner = uc.create_cluster(ctx, alice, spot_body(1, None))
    loser = uc.get_cluster(ctx, alice, ids[0.40])
    assert loser.status == "stopping" and f"preempted by cluster {winner.id}" in loser.status_reason
    settle(rec, winner.id, loser.id)
    loser = uc.get_cluster(ctx, alice, ids[0.40])
    assert loser.status == "stopped" and "preempted" in loser.status_reason
    assert all(uc.get_cluster(ctx, alice, ids[b]).status == "running" for b in (0.50, 0.60, 0.70))
    assert uc.get_cluster(ctx, alice, winner.id).status == "running"


def test_higher_bid_preempts_lower_equal_does_not(
    ctx: Context, alice: Principal, rec: Reconciler
) -> None:
    ids = fill_with_bids(ctx, alice, rec)
    with pytest.raises(InsufficientCapacity):
        uc.create_cluster(ctx, alice, spot_body(1, 0.40))
    c = uc.create_cluster(ctx, alice, spot_body(2, 0.55))
    assert {uc.get_cluster(ctx, alice, ids[b]).status for b in (0.40, 0.50)} == {"stopping"}
    assert uc.get_cluster(ctx, alice, ids[0.60]).status == "running"
    assert c.interruptible and c.bid_per_gpu == 0.55


def test_preempted_volume_survives_bid_resume(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime
) -> None:
    victim = uc.create_cluster(ctx, alice, spot_body(4, 0.40, volume_gb=10))
    settle(rec, victim.id)
    runtime.write_file(victim.id, "/workspace/ckpt.pt", "epoch-7")
    boss = uc.create_cluster(ctx, alice, spot_body(4, None))
    settle(rec, boss.id, victim.id)
    assert uc.get_cluster(ctx, alice, victim.id).status == "stopped"
    uc.terminate_cluster(ctx, alice, boss.id)
    settle(rec, boss.id)
    result = spot.bid_resume_cluster(ctx, alice, victim.id, 0.45, gpu_count=2)
    assert "bid_per_gpu: 0.45" in result.configuration_updates_applied
    settle(rec, victim.id)
    got = uc.get_cluster(ctx, alice, victim.id)
    assert got.status == "running" and got.interruptible and got.bid_per_gpu == 0.45
    assert got.gpu_count == 2
    assert runtime.volume_files(ctx.ownership.volume(victim.id)) == {"ckpt.pt": "epoch-7"}


def test_plain_resume_is_on_demand(ctx: Context, alice: Principal, rec: Reconciler) -> None:
    c = uc.create_cluster(ctx, alice, spot_body(1, 0.40))
    settle(rec, c.id)
    uc.stop_cluster(ctx, alice, c.id)
    settle(rec, c.id)
    result = uc.start_cluster(ctx, alice, c.id, StartCluster())
    assert not result.cluster.interruptible and result.new_rate > result.previous_rate


def test_lowest_price_tracks_capacity_and_bids(
    ctx: Context, alice: Principal, rec: Reconciler
) -> None:
    free = spot.lowest_price(ctx, A, 1)
    assert free.minimum_bid_price == 0.2 and free.uninterruptable_price == 0.76
    assert free.available_gpu_counts == [1, 2, 4] and free.stock_status == "Medium"
    fill_with_bids(ctx, alice, rec)
    busy = spot.lowest_price(ctx, A, 2)
    assert busy.minimum_bid_price == 0.51 and busy.available_gpu_counts == []
    assert busy.stock_status is None
    for _ in range(4):
        uc.create_cluster(ctx, alice, spot_body(1, None))
    assert spot.lowest_price(ctx, A, 1).minimum_bid_price is None


def test_concurrent_bids_never_over_allocate(ctx: Context, alice: Principal) -> None:
    def bid(i: int) -> str:
        try:
            return uc.create_cluster(ctx, alice, spot_body(1, 0.40 + 0.01 * i)).id
        except InsufficientCapacity:
            return "full"

    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(bid, range(16)))
    with ctx.read() as session:
        rows = list(session.execute(select(GpuAllocation.host_id, GpuAllocation.gpu_index)))
    assert len(rows) == len(set(rows)) <= 4
    holders = {
        c.id: c
        for c in uc.list_clusters(ctx, alice, per_page=100).clusters
        if c.status == "starting"
    }
    assert len(holders) == 4


def test_winner_waits_until_the_preempted_container_is_gone(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime
) -> None:
    low = uc.create_cluster(ctx, alice, spot_body(4, 0.40))
    settle(rec, low.id)
    boss = uc.create_cluster(ctx, alice, spot_body(4, None))
    rec.driver.drive(boss.id)  # the victim is still stopping: no container yet
    assert boss.id not in runtime.containers and low.id in runtime.containers
    rec.driver.drive(low.id)
    rec.driver.drive(boss.id)
    assert low.id not in runtime.containers
    assert uc.get_cluster(ctx, alice, boss.id).status == "running"


def test_lowest_price_capacity_fields(ctx: Context, alice: Principal, rec: Reconciler) -> None:
    """What RunPod catalog fetchers read: the default size on a host it fits on, the
    free GPUs of the best such host, and the fleet's count of the type."""
    free = spot.lowest_price(ctx, A, 2)
    assert (free.min_vcpu, free.min_memory_gb) == (spot.DEFAULT_VCPUS, spot.DEFAULT_MEMORY_GB)
    assert free.max_unreserved_gpu_count == 4
    assert (free.total_count, free.rented_count) == (4, 0)
    settle(rec, uc.create_cluster(ctx, alice, spot_body(3, None)).id)
    held = spot.lowest_price(ctx, A, 2)
    assert held.min_vcpu is None and held.max_unreserved_gpu_count == 0
    assert (held.total_count, held.rented_count) == (4, 3)
    one = spot.lowest_price(ctx, A, 1)
    assert one.min_vcpu == spot.DEFAULT_VCPUS and one.max_unreserved_gpu_count == 1
    # Another cloud type's hosts are not counted.
    community = spot.lowest_price(ctx, A, 1, CloudType.COMMUNITY)
    assert community.total_count == 0 and community.min_vcpu is None
    # A cordoned host takes no cluster: nothing qualifies.
    with ctx.transaction() as s:
        for host in s.scalars(select(Host)):
            host.status = "cordoned"
    cordoned = spot.lowest_price(ctx, A, 1)
    assert cordoned.min_vcpu is None and cordoned.max_unreserved_gpu_count == 0
    assert cordoned.total_count == 0
