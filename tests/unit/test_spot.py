from __future__ import annotations

from gpuyard.core.billing.spot import Holder, minimum_bid, plan
from gpuyard.core.models import CloudType, HostCapacity, HostGpu, ResourceRequest
from gpuyard.core.placement import AllocationRatios

A = "NVIDIA RTX A6000"
R = AllocationRatios()


def host(hid: int, used: set[int]) -> HostCapacity:
    return HostCapacity(
        host_id=hid,
        cloud_type=CloudType.SECURE,
        vcpus=64,
        memory_gb=256,
        disk_gb=1000,
        gpus=tuple(HostGpu(i, A) for i in range(4)),
        used_gpu_indices=frozenset(used),
    )


def holder(cid: str, hid: int, gpus: tuple[int, ...], bid: float | None) -> Holder:
    return Holder(cid, hid, gpus, 1, 1, 1, bid)


def req(n: int) -> ResourceRequest:
    return ResourceRequest(A, n, 1, 1, 0, CloudType.SECURE)


FULL = [host(1, {0, 1, 2, 3})]
HOLDERS = [
    holder("ondemand", 1, (0,), None),
    holder("cheap", 1, (1,), 0.40),
    holder("mid", 1, (2,), 0.50),
    holder("dear", 1, (3,), 0.60),
]


def test_on_demand_evicts_the_lowest_bid_only() -> None:
    p = plan(FULL, HOLDERS, req(1), None, R)
    assert p is not None and [v.cluster_id for v in p.victims] == ["cheap"]
    assert p.placement.gpu_indices == (1,)


def test_higher_bid_evicts_lower_and_equal_bid_does_not() -> None:
    p = plan(FULL, HOLDERS, req(2), 0.55, R)
    assert p is not None and {v.cluster_id for v in p.victims} == {"cheap", "mid"}
    assert plan(FULL, HOLDERS, req(1), 0.40, R) is None  # equal to the cheapest: no
    assert plan(FULL, HOLDERS, req(4), None, R) is None  # on-demand holders never move


def test_fewest_evictions_across_hosts() -> None:
    hosts = [host(1, {0, 1}), host(2, {0})]
    holders = [
        holder("a", 1, (0,), 0.40),
        holder("b", 1, (1,), 0.41),
        holder("c", 2, (0,), 0.45),
    ]
    p = plan(hosts, holders, req(4), None, R)
    assert p is not None and p.placement.host_id == 2 and [v.cluster_id for v in p.victims] == ["c"]


def test_minimum_bid() -> None:
    free = [host(1, set())]
    assert minimum_bid(free, [], req(1), 0.38, R) == 0.38
    assert minimum_bid(FULL, HOLDERS, req(1), 0.38, R) == 0.41
    assert minimum_bid(FULL, HOLDERS, req(2), 0.38, R) == 0.51
    assert minimum_bid(FULL, HOLDERS, req(4), 0.38, R) is None
