"""The reserved-IP pool setting: addresses and CIDRs, usable hosts only, sorted."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest
from pydantic import ValidationError

from gpuyard.core.network.ippool import MAX_POOL_SIZE, parse_pool
from tests.helpers import make_settings


def strs(text: str | None) -> list[str]:
    return [str(a) for a in parse_pool(text)]


def test_cidr_excludes_network_and_broadcast() -> None:
    pool = strs("127.0.10.0/28")
    assert len(pool) == 14
    assert pool[0] == "127.0.10.1" and pool[-1] == "127.0.10.14"


def test_small_networks_keep_every_address() -> None:
    assert strs("10.0.0.4/31") == ["10.0.0.4", "10.0.0.5"]
    assert strs("10.0.0.9/32") == ["10.0.0.9"]


def test_lists_mix_addresses_and_cidrs_sorted_without_duplicates() -> None:
    pool = strs(" 203.0.113.9, 203.0.113.0/30 ,2001:db8::5, 203.0.113.2,, 10.1.1.1")
    assert pool == ["10.1.1.1", "203.0.113.1", "203.0.113.2", "203.0.113.9", "2001:db8::5"]
    assert [ipaddress.ip_address(a).version for a in pool][-1] == 6


@pytest.mark.parametrize("text", [None, "", " , "])
def test_empty_pools(text: str | None) -> None:
    assert parse_pool(text) == ()


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("10.0.0.300", "'10.0.0.300' is not an IP address or CIDR"),
        ("10.0.0.0/33", "is not an IP address or CIDR"),
        ("host.example", "is not"),
        ("10.0.0.0/8", f"more than {MAX_POOL_SIZE}"),
    ],
)
def test_bad_pools_name_the_entry(text: str, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        parse_pool(text)


def test_settings_refuse_a_bad_pool_at_start(tmp_path: Path) -> None:
    assert make_settings(tmp_path, reserved_ips="127.0.10.0/30").reserved_ips == "127.0.10.0/30"
    with pytest.raises(ValidationError, match="reserved_ips"):
        make_settings(tmp_path, reserved_ips="nope")
