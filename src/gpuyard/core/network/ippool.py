"""The reserved-IP pool an admin configures (``GPUYARD_RESERVED_IPS``).

The setting is a comma-separated list of addresses and CIDRs, e.g.
``127.0.10.0/28`` or ``203.0.113.5, 203.0.113.64/30``. A CIDR contributes its usable
hosts: the network and broadcast addresses of networks larger than /31 are left
out (IPv6: the subnet-router anycast address), as ``ipaddress.hosts()`` does.
"""

from __future__ import annotations

import ipaddress
from functools import lru_cache

Address = ipaddress.IPv4Address | ipaddress.IPv6Address

# Allocation scans the pool in order; a pool this size is already far beyond what a
# self-hosted installation hands out, and a typo like /8 fails loudly instead.
MAX_POOL_SIZE = 65_536


def _entry(text: str) -> list[Address]:
    try:
        if "/" not in text:
            return [ipaddress.ip_address(text)]
        net = ipaddress.ip_network(text, strict=False)
    except ValueError as exc:
        raise ValueError(f"{text!r} is not an IP address or CIDR") from exc
    if net.num_addresses > MAX_POOL_SIZE:
        raise ValueError(f"{text!r} has more than {MAX_POOL_SIZE} addresses")
    return list(net.hosts())


@lru_cache(maxsize=8)
def parse_pool(text: str | None) -> tuple[Address, ...]:
    """Every address of the pool, sorted (IPv4 before IPv6), without duplicates.
    None or blank is an empty pool. Raises ValueError naming the bad entry."""
    if text is None:
        return ()
    found: set[Address] = set()
    for raw in text.split(","):
        entry = raw.strip()
        if entry:
            found.update(_entry(entry))
        if len(found) > MAX_POOL_SIZE:
            raise ValueError(f"the pool has more than {MAX_POOL_SIZE} addresses")
    return tuple(sorted(found, key=lambda a: (a.version, int(a))))
