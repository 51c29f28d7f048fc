"""CUDA driver versions, pure: how they compare ("12.10" is above "12.4"), what
placement does with a minimum and an allowed list (a host of unknown version meets
neither), the refusal's words, and reading versions from NVML and nvidia-smi."""

from __future__ import annotations

import pytest

from gpuyard.core.errors import InsufficientCapacity
from gpuyard.core.placement import (
    AllocationRatios,
    cuda_from_nvml,
    cuda_satisfies,
    cuda_version_key,
    place,
    why_not,
)
from gpuyard.runtimes.engines.inventory import parse_cuda_version
from tests.unit.test_placement import host, req

R = AllocationRatios()


def test_versions_compare_as_numbers() -> None:
    assert cuda_version_key("12.10") == (12, 10)
    assert cuda_version_key("12") == (12, 0)
    assert cuda_version_key("12.10") > cuda_version_key("12.4")  # type: ignore[operator]
    assert cuda_version_key("13.0") > cuda_version_key("12.10")  # type: ignore[operator]
    for bad in (None, "", "12.x", "v12", "12.4.1", "12.", ".4"):
        assert cuda_version_key(bad) is None, bad


@pytest.mark.parametrize(
    ("version", "minimum", "allowed", "ok"),
    [
        ("12.10", "12.4", None, True),
        ("12.4", "12.4", None, True),
        ("12.2", "12.4", None, False),
        ("12", "12.0", None, True),
        (None, "11.0", None, False),  # unknown meets no minimum
        (None, None, None, True),  # no constraint: any host
        ("12.6", None, ("12.2", "12.6"), True),
        ("12.6", None, ("12.2",), False),
        ("12.6", "12.4", ("12.2", "12.6"), True),
        ("12.2", "12.4", ("12.2", "12.6"), False),
        (None, None, ("12.2",), False),
        ("12.0", None, ("12",), True),
    ],
)
def test_satisfies(
    version: str | None, minimum: str | None, allowed: tuple[str, ...] | None, ok: bool
) -> None:
    assert cuda_satisfies(version, minimum, allowed) is ok


def test_placement_keeps_the_hosts_that_meet_the_minimum() -> None:
    hosts = [
        host(1, 4, cuda_version="12.2"),
        host(2, 4, cuda_version="12.10"),
        host(3, 4),  # unknown
        host(4, 1, cuda_version="12.4"),
    ]
    # Without a minimum binpack takes the fullest host (4, one GPU).
    assert place(hosts, req(1), R).host_id == 4
    assert place(hosts, req(1, min_cuda_version="12.4"), R).host_id == 4
    # 12.10 is above 12.4 and 12.6; 12.4 is not above 12.6.
    assert place(hosts, req(1, min_cuda_version="12.6"), R).host_id == 2
    assert place(hosts, req(2, min_cuda_version="12.4"), R).host_id == 2
    assert place(hosts, req(1, allowed_cuda_versions=("12.2",)), R).host_id == 1
    assert why_not(hosts[2], req(1, min_cuda_version="11.0"), R) == (
        "the host's CUDA driver version is unknown"
    )
    assert why_not(hosts[0], req(1, min_cuda_version="12.4"), R) == (
        "the host's CUDA driver version is 12.2"
    )


def test_no_host_with_the_version_is_said_so() -> None:
    hosts = [host(1, 4, cuda_version="12.2"), host(2, 4)]
    with pytest.raises(InsufficientCapacity) as caught:
        place(hosts, req(1, min_cuda_version="13.0"), R)
    error = caught.value
    assert error.message.startswith(
        "No host has a CUDA driver version at least 13.0 (min_cuda_version)"
    )
    assert error.details["requested"]["min_cuda_version"] == "13.0"
    assert [a["cuda_version"] for a in error.details["available"]] == ["12.2", None]
    assert "hint" in error.details
    # A host meets the version but is full: the usual capacity refusal, naming both.
    hosts = [host(1, 1, used={0}, cuda_version="13.0"), host(2, 4, cuda_version="12.2")]
    with pytest.raises(InsufficientCapacity) as caught:
        place(hosts, req(1, min_cuda_version="13.0"), R)
    assert caught.value.message.startswith("No host has free capacity")
    assert "CUDA driver version is 12.2" in caught.value.message
    assert "not enough free" in caught.value.message


def test_versions_from_nvml_and_nvidia_smi() -> None:
    assert cuda_from_nvml(12040) == "12.4"
    assert cuda_from_nvml(12100) == "12.10"
    assert cuda_from_nvml(11080) == "11.8"
    out = "==============NVSMI LOG==============\n\nDriver Version : 550.54.15\n"
    out += "CUDA Version   : 12.4\n"
    assert parse_cuda_version(out) == "12.4"
    assert parse_cuda_version("Driver Version : 550.54.15\n") is None
