from __future__ import annotations

import pytest

from gpuyard.core.errors import InsufficientCapacity
from gpuyard.core.models import CloudType, HostCapacity, HostGpu, ResourceRequest
from gpuyard.core.placement import AllocationRatios, place

A = "NVIDIA RTX A6000"


def host(hid: int, gpus: int, used: set[int] | None = None, **kw: object) -> HostCapacity:
    values: dict[str, object] = {
        "host_id": hid,
        "cloud_type": CloudType.SECURE,
        "vcpus": 32,
        "memory_gb": 128,
        "disk_gb": 1000,
        "gpus": tuple(HostGpu(i, A) for i in range(gpus)),
        "used_gpu_indices": frozenset(used or ()),
    }
    values.update(kw)
    return HostCapacity(**values)  # type: ignore[arg-type]


def req(n: int, **kw: object) -> ResourceRequest:
    values: dict[str, object] = {
        "gpu_type": A,
        "gpu_count": n,
        "vcpus": 2,
        "memory_gb": 8,
        "disk_gb": 10,
    }
    values.update(kw)
    return ResourceRequest(**values)  # type: ignore[arg-type]


def test_best_fit_prefers_the_fullest_host_that_fits() -> None:
    hosts = [host(1, 8), host(2, 8, used={0, 1, 2, 3, 4, 5})]
    assert place(hosts, req(2), AllocationRatios()).host_id == 2
    assert place(hosts, req(2), AllocationRatios()).gpu_indices == (6, 7)
    assert place(hosts, req(3), AllocationRatios()).host_id == 1


def test_no_capacity_reports_what_was_asked_and_free() -> None:
    with pytest.raises(InsufficientCapacity) as exc:
        place([host(1, 2, used={0})], req(2), AllocationRatios())
    assert exc.value.details["requested"]["gpu_count"] == 2
    assert exc.value.details["available"][0]["gpus"] == {A: 1}


def test_no_capacity_names_the_resource_that_is_short() -> None:
    # Every GPU is free; the vCPUs are what is missing, and the message says so.
    with pytest.raises(InsufficientCapacity) as exc:
        place([host(1, 4, vcpus=2)], req(2, vcpus=4), AllocationRatios())
    assert "not enough free vCPUs" in exc.value.message
    assert "2 x NVIDIA RTX A6000, 4 vCPUs and 8 GB of memory" in exc.value.message
    assert exc.value.details["available"][0]["why_not"] == "not enough free vCPUs"
    with pytest.raises(InsufficientCapacity) as exc:
        place([host(1, 1), host(2, 2, used={0})], req(2), AllocationRatios())
    assert exc.value.message.endswith(f"not enough free {A} GPUs")


def test_cpu_memory_disk_and_ratios() -> None:
    full = host(1, 0, used_vcpus=31.0)
    with pytest.raises(InsufficientCapacity):
        place([full], req(0, vcpus=2), AllocationRatios())
    assert place([full], req(0, vcpus=2), AllocationRatios(vcpu=2.0)).host_id == 1
    with pytest.raises(InsufficientCapacity):
        place([host(1, 0)], req(0, memory_gb=129), AllocationRatios())
    with pytest.raises(InsufficientCapacity):
        place([host(1, 0)], req(0, disk_gb=1001), AllocationRatios())


def test_cloud_type_must_match_unless_all() -> None:
    community = host(1, 4, cloud_type=CloudType.COMMUNITY)
    with pytest.raises(InsufficientCapacity):
        place([community], req(1, cloud_type=CloudType.SECURE), AllocationRatios())
    assert place([community], req(1, cloud_type=CloudType.ALL), AllocationRatios()).host_id == 1


def test_a_gpu_type_no_host_has_names_the_setting_that_declares_it() -> None:
    with pytest.raises(InsufficientCapacity) as absent:
        place([host(1, 0), host(2, 0)], req(1), AllocationRatios())
    assert "GPUYARD_LOCAL_GPUS" in absent.value.message
    assert "GPUYARD_LOCAL_GPUS" in absent.value.details["hint"]
    # Only busy (the type exists): no hint, the usual answer.
    with pytest.raises(InsufficientCapacity) as busy:
        place([host(1, 1, used={0})], req(1), AllocationRatios())
    assert "GPUYARD_LOCAL_GPUS" not in busy.value.message and "hint" not in busy.value.details
