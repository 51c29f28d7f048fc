"""core/billing/quotas.py: limits, usage arithmetic and the check."""

from __future__ import annotations

import pytest

from gpuyard.core.billing.quotas import (
    GIB,
    KEEP,
    MAX_LIMIT,
    LimitChange,
    Limits,
    Resource,
    Usage,
    above_account,
    apply_change,
    check_value,
    first_breach,
    gb_of,
    total,
)

A6000 = "NVIDIA RTX A6000"
H100 = "NVIDIA H100"


def test_gb_rounds_up() -> None:
    assert gb_of(0) == 0
    assert gb_of(1) == 1
    assert gb_of(GIB) == 1
    assert gb_of(GIB + 1) == 2
    assert gb_of(-5) == 0


def test_usage_arithmetic() -> None:
    a = Usage(gpus_by_type={A6000: 2}, vcpus=8, volume_gb=10, running_clusters=1)
    b = Usage(gpus_by_type={A6000: 1, H100: 4}, vcpus=4, snapshot_gb=3, running_clusters=1)
    s = a.plus(b)
    assert s.gpus == 7 and s.gpus_by_type == {A6000: 3, H100: 4}
    assert (s.vcpus, s.volume_gb, s.snapshot_gb, s.running_clusters) == (12, 10, 3, 2)
    back = s.minus(b)
    assert back == a
    assert total([a, b]) == s
    assert s.amount(Resource.GPUS) == 7
    assert s.amount(Resource.GPUS, H100) == 4
    assert s.amount(Resource.GPUS, "other") == 0
    assert s.as_dict()["gpus_by_type"] == {A6000: 3, H100: 4}


def test_limits_rows_round_trip() -> None:
    limits = Limits(gpus=8, gpus_by_type={H100: 2}, vcpus=64, snapshot_gb=100)
    rows = limits.rows()
    assert ("gpus", "", 8) in rows and ("gpus", H100, 2) in rows
    assert Limits.from_rows(rows) == limits
    # Unknown resources (a newer version's) are ignored.
    assert Limits.from_rows([*rows, ("tpus", "", 3)]) == limits
    assert Limits().rows() == []


def test_check_value() -> None:
    assert check_value(None) is None
    assert check_value(0) is None
    assert check_value(MAX_LIMIT) is None
    assert check_value(-1) == "must be 0 or more"
    assert check_value(MAX_LIMIT + 1) is not None
    assert check_value(True) is not None
    assert check_value(1.5) is not None


def test_apply_change_keeps_absent_and_removes_null() -> None:
    limits = Limits(gpus=8, gpus_by_type={H100: 2, A6000: 4}, vcpus=64)
    change = LimitChange(gpus=None, gpus_by_type={H100: None, A6000: 6}, volume_gb=500)
    after = apply_change(limits, change)
    assert after == Limits(gpus=None, gpus_by_type={A6000: 6}, vcpus=64, volume_gb=500)
    assert apply_change(limits, LimitChange()) == limits
    assert LimitChange().gpus is KEEP
    assert change.fields() == [
        ("gpus", None),
        (f"gpus_by_type.{H100}", None),
        (f"gpus_by_type.{A6000}", 6),
        ("volume_gb", 500),
    ]


def test_project_limits_within_account() -> None:
    account = Limits(gpus=8, gpus_by_type={H100: 2}, vcpus=64)
    assert above_account(Limits(gpus=8, vcpus=10, volume_gb=10**6), account) is None
    assert above_account(Limits(gpus=9), account) == ("gpus", 9, 8)
    assert above_account(Limits(gpus_by_type={H100: 3}), account) == (f"gpus_by_type.{H100}", 3, 2)
    # A type the account does not limit is still held to all GPUs.
    assert above_account(Limits(gpus_by_type={A6000: 9}), account) == (
        f"gpus_by_type.{A6000}",
        9,
        8,
    )
    assert above_account(Limits(vcpus=65), account) == ("vcpus", 65, 64)
    assert above_account(Limits(vcpus=65), Limits()) is None


def test_breach_total_gpus() -> None:
    limits = Limits(gpus=4)
    in_use = Usage(gpus_by_type={A6000: 3})
    assert first_breach(limits, in_use, Usage(gpus_by_type={A6000: 1})) is None
    breach = first_breach(limits, in_use, Usage(gpus_by_type={H100: 2}))
    assert breach is not None
    assert (breach.resource, breach.gpu_type, breach.limit, breach.in_use, breach.asked) == (
        Resource.GPUS,
        "",
        4,
        3,
        2,
    )
    assert "limit 4, 3 in use, 2 asked" in breach.describe("account 1")


def test_breach_by_type_first_and_only_for_that_type() -> None:
    limits = Limits(gpus=10, gpus_by_type={H100: 1})
    in_use = Usage(gpus_by_type={H100: 1, A6000: 5})
    breach = first_breach(limits, in_use, Usage(gpus_by_type={H100: 1}))
    assert breach is not None and breach.gpu_type == H100 and breach.in_use == 1
    # Other types are not held to the H100 limit.
    assert first_breach(limits, in_use, Usage(gpus_by_type={A6000: 4})) is None


def test_nothing_asked_is_never_refused() -> None:
    # Over a lowered limit already, a request that asks none of it passes.
    limits = Limits(vcpus=4, gpus=0, volume_gb=10)
    in_use = Usage(vcpus=100, gpus_by_type={A6000: 2}, volume_gb=50)
    assert first_breach(limits, in_use, Usage(snapshot_gb=5)) is None
    breach = first_breach(limits, in_use, Usage(vcpus=1))
    assert breach is not None and breach.resource is Resource.VCPUS


@pytest.mark.parametrize(
    ("limits", "asked", "resource"),
    [
        (Limits(running_clusters=2), Usage(running_clusters=1), Resource.RUNNING_CLUSTERS),
        (Limits(volume_gb=100), Usage(volume_gb=1), Resource.VOLUME_GB),
        (Limits(snapshot_gb=100), Usage(snapshot_gb=1), Resource.SNAPSHOT_GB),
        (Limits(gpus=0), Usage(gpus_by_type={A6000: 1}), Resource.GPUS),
    ],
)
def test_each_resource_at_its_limit(limits: Limits, asked: Usage, resource: Resource) -> None:
    full = Usage(running_clusters=2, volume_gb=100, snapshot_gb=100)
    breach = first_breach(limits, full, asked)
    assert breach is not None and breach.resource is resource
    assert first_breach(limits, Usage(), Usage()) is None
