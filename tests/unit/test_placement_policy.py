"""Placement across a fleet, pure: the filters (status, cloud type, location, free
resources) and the two policies, binpack and spread, on several hosts."""

from __future__ import annotations

import itertools

import pytest

from gpuyard.core.errors import InsufficientCapacity
from gpuyard.core.fleet import PlacementPolicy
from gpuyard.core.models import CloudType, HostCapacity, ResourceRequest
from gpuyard.core.placement import AllocationRatios, place, why_not
from tests.unit.test_placement import A, host, req

BINPACK, SPREAD = PlacementPolicy.BINPACK, PlacementPolicy.SPREAD
R = AllocationRatios()


def cpu(vcpus: int = 2, **kw: object) -> ResourceRequest:
    return req(0, gpu_type=None, vcpus=vcpus, **kw)


def chosen(hosts: list[HostCapacity], r: ResourceRequest, policy: PlacementPolicy) -> int:
    """The host chosen, checked to be the same whatever order the hosts come in."""
    answers = {place(list(p), r, R, policy).host_id for p in itertools.permutations(hosts)}
    assert len(answers) == 1, answers
    return answers.pop()


def test_binpack_takes_the_host_left_with_fewest_free_gpus() -> None:
    hosts = [host(1, 8), host(2, 8, used={0, 1, 2, 3}), host(3, 4, used={0})]
    # Free A6000s: 8, 4, 3. Two fit everywhere; binpack leaves host 3 with 1.
    assert chosen(hosts, req(2), BINPACK) == 3
    # Four do not fit on host 3: host 2 is left with none.
    assert chosen(hosts, req(4), BINPACK) == 2


def test_spread_takes_the_host_with_most_free_gpus() -> None:
    hosts = [host(1, 4, used={0, 1}), host(2, 8, used={0, 1, 2, 3}), host(3, 8, used={0})]
    assert chosen(hosts, req(1), SPREAD) == 3
    # Only hosts that fit count: 8 GPUs fit nowhere.
    with pytest.raises(InsufficientCapacity):
        place(hosts, req(8), R, SPREAD)


def test_binpack_breaks_gpu_ties_by_free_vcpus_then_host_id() -> None:
    hosts = [host(1, 4), host(2, 4, used_vcpus=16), host(3, 4, used_vcpus=16)]
    assert chosen(hosts, req(1), BINPACK) == 2
    assert chosen([host(5, 4), host(4, 4)], req(1), BINPACK) == 4


def test_spread_breaks_ties_by_host_id() -> None:
    # Same free GPUs; spread does not look at vCPUs for a GPU request.
    hosts = [host(7, 4, used_vcpus=30), host(3, 4), host(5, 4, used_vcpus=1)]
    assert chosen(hosts, req(1), SPREAD) == 3


def test_cpu_only_requests_binpack_by_fewest_free_vcpus() -> None:
    hosts = [host(1, 0), host(2, 0, used_vcpus=20), host(3, 8, used_vcpus=28)]
    # Free vCPUs 32, 12, 4: four fit on each; binpack fills host 3.
    assert chosen(hosts, cpu(4), BINPACK) == 3
    assert chosen(hosts, cpu(8), BINPACK) == 2


def test_cpu_only_requests_spread_by_most_free_vcpus() -> None:
    hosts = [host(1, 0, used_vcpus=10), host(2, 0, used_vcpus=20), host(3, 8)]
    assert chosen(hosts, cpu(4), SPREAD) == 3
    assert chosen([host(4, 0, used_vcpus=1), host(2, 0, used_vcpus=1)], cpu(4), SPREAD) == 2


def test_a_host_that_takes_no_placements_is_never_chosen() -> None:
    closed = host(1, 8, takes_placements=False)
    for policy in PlacementPolicy:
        assert chosen([closed, host(2, 8, used={0, 1, 2, 3, 4, 5})], req(2), policy) == 2
        assert chosen([closed, host(2, 0)], cpu(2), policy) == 2
        with pytest.raises(InsufficientCapacity):
            place([closed], req(1), R, policy)
    assert "takes no new clusters" in (why_not(closed, req(1), R) or "")


def test_location_pins_the_request() -> None:
    hosts = [host(1, 8, location="eu"), host(2, 8, used={0}, location="us")]
    for policy in PlacementPolicy:
        assert chosen(hosts, req(1, location="eu"), policy) == 1
        assert chosen(hosts, req(1, location="us"), policy) == 2
        with pytest.raises(InsufficientCapacity):
            place(hosts, req(1, location="ap"), R, policy)
    # No location: anywhere.
    assert chosen(hosts, req(1), BINPACK) == 2
    assert why_not(hosts[0], req(1, location="us"), R) == "the host is in location 'eu'"


def test_cloud_type_and_resources_filter() -> None:
    community = host(1, 8, cloud_type=CloudType.COMMUNITY)
    small = host(2, 8, memory_gb=8, used={0})
    hosts = [community, small]
    assert chosen(hosts, req(1, cloud_type=CloudType.SECURE), SPREAD) == 2
    assert chosen(hosts, req(1, cloud_type=CloudType.COMMUNITY), BINPACK) == 1
    assert chosen(hosts, req(1, memory_gb=16), BINPACK) == 1
    assert why_not(small, req(1, memory_gb=16), R) == "not enough free memory"
    assert why_not(small, req(8), R) == f"not enough free {A} GPUs"
    assert why_not(community, req(1, cloud_type=CloudType.SECURE), R) == (
        "the host is COMMUNITY cloud"
    )
