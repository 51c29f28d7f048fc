"""Placement across a fleet of host rows (no engines needed to place): the policies
land clusters where they say, concurrent creates never over-commit, hosts that take no
placements are never chosen, locations pin, in-flight volume moves keep the source's
disk counted, and the catalog sums the fleet. SQLite and PostgreSQL."""

from __future__ import annotations

import dataclasses
from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import func, select, update

from gpuyard.core.errors import InsufficientCapacity, ValidationFailed
from gpuyard.core.fleet import HostStatus, PlacementPolicy
from gpuyard.core.models import ResourceRequest
from gpuyard.services.capacity.placement import claim
from gpuyard.services.catalog.gpu_types import gpu_type_offers
from gpuyard.services.catalog.locations import list_locations
from gpuyard.services.clusters import use_cases as uc
from gpuyard.services.clusters.requests import CreateCluster
from gpuyard.services.clusters.views import details
from gpuyard.services.context import Context
from gpuyard.services.fleet.hosts import capacities
from gpuyard.services.tenancy.auth import Principal
from gpuyard.store.schema import Cluster, GpuAllocation, Host, VolumeMove
from tests.helpers import add_host_row

A6000 = "NVIDIA RTX A6000"


def close_local_host(ctx: Context) -> None:
    """The fixture's own machine takes nothing: only the test's hosts are in play."""
    with ctx.transaction() as s:
        s.execute(update(Host).where(Host.is_local.is_(True)).values(status="cordoned"))


def three_hosts(ctx: Context) -> list[int]:
    close_local_host(ctx)
    return [add_host_row(ctx, f"h{i}") for i in (1, 2, 3)]


def with_policy(ctx: Context, policy: PlacementPolicy) -> Context:
    settings = ctx.settings.model_copy(update={"placement_policy": policy})
    return dataclasses.replace(ctx, settings=settings)


def one_gpu(name: str = "c", **kw: object) -> CreateCluster:
    return CreateCluster.model_validate(
        {"name": name, "gpu_type": A6000, "gpu_count": 1, "docker_image": "img", **kw}
    )


def allocations_per_host(ctx: Context) -> dict[int, int]:
    with ctx.read() as s:
        rows = s.execute(
            select(GpuAllocation.host_id, func.count()).group_by(GpuAllocation.host_id)
        )
        return {host_id: int(n) for host_id, n in rows}


def test_binpack_fills_one_host_before_the_next(ctx: Context, alice: Principal) -> None:
    h1, h2, h3 = three_hosts(ctx)
    packed = with_policy(ctx, PlacementPolicy.BINPACK)
    hosts = [uc.create_cluster(packed, alice, one_gpu(f"c{i}")).host_id for i in range(12)]
    assert hosts == [h1] * 4 + [h2] * 4 + [h3] * 4
    with pytest.raises(InsufficientCapacity):
        uc.create_cluster(packed, alice, one_gpu("one-too-many"))


def test_spread_takes_the_emptiest_host_each_time(ctx: Context, alice: Principal) -> None:
    h1, h2, h3 = three_hosts(ctx)
    spread = with_policy(ctx, PlacementPolicy.SPREAD)
    hosts = [uc.create_cluster(spread, alice, one_gpu(f"c{i}")).host_id for i in range(12)]
    assert hosts == [h1, h2, h3] * 4
    assert allocations_per_host(ctx) == {h1: 4, h2: 4, h3: 4}


def test_the_default_policy_is_binpack(ctx: Context, alice: Principal) -> None:
    h1, _, _ = three_hosts(ctx)
    assert ctx.settings.placement_policy is PlacementPolicy.BINPACK
    assert {uc.create_cluster(ctx, alice, one_gpu(f"c{i}")).host_id for i in range(3)} == {h1}


@pytest.mark.parametrize("policy", list(PlacementPolicy))
def test_32_concurrent_creates_for_a_fleets_12_gpus(
    ctx: Context, alice: Principal, policy: PlacementPolicy
) -> None:
    h1, h2, h3 = three_hosts(ctx)
    fleet = with_policy(ctx, policy)

    def create(i: int) -> str:
        try:
            return uc.create_cluster(fleet, alice, one_gpu(f"c{i}")).id
        except InsufficientCapacity:
            return "INSUFFICIENT_CAPACITY"

    with ThreadPoolExecutor(max_workers=32) as pool:
        results = list(pool.map(create, range(32)))

    assert results.count("INSUFFICIENT_CAPACITY") == 20
    assert allocations_per_host(ctx) == {h1: 4, h2: 4, h3: 4}
    with ctx.read() as s:
        rows = list(s.execute(select(GpuAllocation.host_id, GpuAllocation.gpu_index)))
        assert len(rows) == 12 and len(set(rows)) == 12
        assert s.scalar(select(func.count()).select_from(Cluster)) == 12


def test_cordoned_draining_and_unreachable_hosts_are_never_chosen(
    ctx: Context, alice: Principal
) -> None:
    close_local_host(ctx)
    add_host_row(ctx, "cordoned", 8, status=HostStatus.CORDONED.value)
    add_host_row(ctx, "draining", 8, status=HostStatus.DRAINING.value)
    add_host_row(ctx, "unreachable", 8, healthy=False)
    open_host = add_host_row(ctx, "open", 2)
    for policy in PlacementPolicy:
        fleet = with_policy(ctx, policy)
        assert uc.create_cluster(fleet, alice, one_gpu(str(policy))).host_id == open_host
    with pytest.raises(InsufficientCapacity) as exc:
        uc.create_cluster(ctx, alice, one_gpu("third"))
    # The error shows the hosts that take placements, not the closed ones.
    assert [h["host_id"] for h in exc.value.details["available"]] == [open_host]
    assert allocations_per_host(ctx) == {open_host: 2}


@pytest.mark.parametrize(
    ("status", "healthy", "why"),
    [("cordoned", True, "is cordoned"), ("draining", True, "is draining"),
     ("active", False, "is unreachable")],
)  # fmt: skip
def test_a_pinned_host_that_takes_nothing_says_why(
    ctx: Context, status: str, healthy: bool, why: str
) -> None:
    host_id = add_host_row(ctx, "pinned", 4, status=status, healthy=healthy)
    request = ResourceRequest(gpu_type=A6000, gpu_count=1, vcpus=1, memory_gb=1, disk_gb=1)
    with pytest.raises(InsufficientCapacity) as exc, ctx.transaction() as s:
        claim(
            s,
            cluster_id="abcdefghijklmn",
            request=request,
            volume_gb=0,
            ratios=ctx.settings.allocation_ratios,
            now=ctx.clock.now(),
            host_id=host_id,
        )
    assert why in exc.value.message and "pinned" in exc.value.message
    assert exc.value.details["host_status"] == status
    assert exc.value.details["reachable"] is healthy


def test_location_pins_a_create(ctx: Context, alice: Principal) -> None:
    close_local_host(ctx)
    lab = add_host_row(ctx, "lab1", 4, location="lab")
    eu = add_host_row(ctx, "eu1", 1, location="eu-west")
    add_host_row(ctx, "closed-eu", 4, location="eu-west", status="cordoned")
    # Binpack alone would pick the 1-GPU host; the pin decides.
    assert uc.create_cluster(ctx, alice, one_gpu("a"), location="lab").host_id == lab
    assert uc.create_cluster(ctx, alice, one_gpu("b"), location="eu-west").host_id == eu
    # A known location that is full: capacity; one no host is at: input error.
    with pytest.raises(InsufficientCapacity) as full:
        uc.create_cluster(ctx, alice, one_gpu("c"), location="eu-west")
    assert full.value.details["requested"]["location"] == "eu-west"
    with pytest.raises(ValidationFailed) as unknown:
        uc.create_cluster(ctx, alice, one_gpu("d"), location="mars")
    assert unknown.value.field == "location"
    assert "eu-west" in unknown.value.details["locations"]
    # No location: anywhere (the lab host has room).
    assert uc.create_cluster(ctx, alice, one_gpu("e")).host_id == lab
    with ctx.read() as s:
        assert s.scalar(select(func.count()).select_from(Cluster)) == 3


def test_an_in_flight_volume_move_keeps_the_source_disk_counted(
    ctx: Context, alice: Principal
) -> None:
    close_local_host(ctx)
    source = add_host_row(ctx, "source", 4, disk_gb=100)
    target = add_host_row(ctx, "target", 0, disk_gb=1000)
    with ctx.transaction() as s:
        s.add(
            VolumeMove(
                cluster_id="movingcluster1",
                from_host_id=source,
                to_host_id=target,
                volume_gb=60,
                source_volume="vol",
                reason="test",
                status="copying",
            )
        )
    with ctx.read() as s:
        (cap,) = capacities(s, [source])
        assert cap.used_disk_gb == 60
    # 10 GB container disk + 40 GB volume: 50 > 100 - 60.
    big = one_gpu("big", volume_gb=40)
    for status in ("copying", "copied"):
        with ctx.transaction() as s:
            s.execute(update(VolumeMove).values(status=status))
        with pytest.raises(InsufficientCapacity):
            uc.create_cluster(ctx, alice, big)
    for status in ("done", "failed"):
        with ctx.transaction() as s:
            s.execute(update(VolumeMove).values(status=status))
        with ctx.read() as s:
            (cap,) = capacities(s, [source])
            assert cap.used_disk_gb == 0
    assert uc.create_cluster(ctx, alice, big).host_id == source


def test_catalog_and_locations_sum_the_hosts_that_take_placements(
    ctx: Context, alice: Principal
) -> None:
    # The fixture's machine (4 A6000 + 4 4090, location "local") stays open.
    add_host_row(ctx, "lab1", 4, location="lab")
    add_host_row(ctx, "lab2", 2, location="lab")
    add_host_row(ctx, "lab-cordoned", 8, location="lab", status="cordoned")
    add_host_row(ctx, "lab-down", 8, location="lab", healthy=False)
    uc.create_cluster(ctx, alice, one_gpu("a"), location="lab")
    offers = {o.info.id: o for o in gpu_type_offers(ctx)}
    assert (offers[A6000].total_gpus, offers[A6000].available_gpus) == (10, 9)
    locations = {loc["location"]: loc for loc in list_locations(ctx)}
    lab = locations["lab"]
    assert (lab["hosts"], lab["healthy_hosts"]) == (4, 3)
    assert lab["gpu_types"] == [{"gpu_type": A6000, "total_gpus": 6, "free_gpus": 5}]
    assert locations["local"]["gpu_types"][0]["total_gpus"] == 4


def test_network_shows_the_clusters_host_address(ctx: Context, alice: Principal) -> None:
    close_local_host(ctx)
    remote = add_host_row(ctx, "gpu7", 4)
    body = one_gpu("web", ports=[{"internal_port": 8888, "protocol": "http"}])
    cluster = uc.create_cluster(ctx, alice, body)
    assert cluster.host_id == remote
    with ctx.read() as s:
        row = s.get(Cluster, cluster.id)
        assert row is not None
        (view,) = details(ctx, [row], s)
    assert view.host_address == "gpu7.example"
    assert view.ports[0].external_port > 0


def test_training_cluster_location_skips_hosts_that_take_nothing(ctx: Context) -> None:
    from gpuyard.services.training.nodes import NodePlan
    from gpuyard.services.training.placement import location_hosts

    close_local_host(ctx)
    add_host_row(ctx, "t-cordoned", 8, location="train", status="cordoned")
    add_host_row(ctx, "t-down", 8, location="train", healthy=False)
    small = add_host_row(ctx, "t-small", 2, location="train")
    big = add_host_row(ctx, "t-big", 8, location="train")
    plan = NodePlan(A6000, 2, 4, 16, None)
    with ctx.transaction() as s:
        # Two workers of 2 GPUs fit only on the big host; one fits on both (binpack:
        # the small one first); the closed hosts are never offered.
        assert location_hosts(ctx, s, "train", plan, 2) == [big]
        assert location_hosts(ctx, s, "train", plan, 1) == [small, big]
        # Nothing has room: every host there that takes placements (spot may yield).
        assert location_hosts(ctx, s, "train", plan, 8) == [small, big]
        with pytest.raises(ValidationFailed):
            location_hosts(ctx, s, "nowhere", plan, 1)


def test_placement_follows_changes_made_behind_its_back(ctx: Context, alice: Principal) -> None:
    """What another replica or the hosts API changes (claims, cordons, new hosts) is
    seen by the next placement, though this process's fleet hint did not make it."""
    h1, h2, h3 = three_hosts(ctx)
    assert uc.create_cluster(ctx, alice, one_gpu("a")).host_id == h1
    # Another replica takes h1's other GPUs: the next create must not land there.
    with ctx.transaction() as s:
        for index in (1, 2, 3):
            s.add(GpuAllocation(host_id=h1, gpu_index=index, cluster_id=f"other{index}"))
    assert uc.create_cluster(ctx, alice, one_gpu("b")).host_id == h2
    with ctx.transaction() as s:
        s.execute(update(Host).where(Host.id == h2).values(status="cordoned"))
    assert uc.create_cluster(ctx, alice, one_gpu("c")).host_id == h3
    with ctx.transaction() as s:
        s.execute(update(Host).where(Host.id == h2).values(status="active"))
    # h2 and h3 both have 3 free: the lower id, now that h2 takes placements again.
    assert uc.create_cluster(ctx, alice, one_gpu("d")).host_id == h2
    h4 = add_host_row(ctx, "h4", 1)
    # Binpack: the new 1-GPU host is left with none free.
    assert uc.create_cluster(ctx, alice, one_gpu("e")).host_id == h4
    with ctx.read() as s:
        rows = list(s.execute(select(GpuAllocation.host_id, GpuAllocation.gpu_index)))
    assert len(rows) == len(set(rows)) == 8
