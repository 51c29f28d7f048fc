"""A training cluster's own IPv4 network: its subnet and its nodes' fixed addresses.

Every cluster gets a subnet of its own, the same on every host its nodes run on, so
nodes on different hosts are on one network (the hosts join their copies of it with an
overlay, runtimes/slurm/overlay.py). Addresses are fixed per node and chosen here, not by the
engines: two hosts' engines would each hand out the same first address.

Layout of a subnet: the first address is each host's own gateway (every host has one,
kept from crossing the overlay), the last usable one the controller's (as before
clusters spanned hosts), workers from :data:`FIRST_WORKER_OFFSET` up.
"""

from __future__ import annotations

import hashlib
import ipaddress
import random
from collections.abc import Callable, Iterable, Sequence

# One /24 per cluster: 1 gateway, 1 controller, up to 243 workers (MAX_WORKERS is 64).
SUBNET_PREFIX = 24
FIRST_WORKER_OFFSET = 10
# The private /8 the default pools are carved from.
_DEFAULT_BASE = 10
_DEFAULT_SECOND_OCTETS = range(192, 248)


def default_pool(installation: str) -> str:
    """This installation's default pool of cluster subnets: a /16 of 10.192.0.0/10 picked
    by the installation's id, so two installations that share hosts (each with default
    settings) most likely draw from different pools, and even in the same pool pick
    subnets at random (:func:`pick_subnet`)."""
    digest = int(hashlib.sha256(installation.encode()).hexdigest()[:8], 16)
    second = _DEFAULT_SECOND_OCTETS[digest % len(_DEFAULT_SECOND_OCTETS)]
    return f"{_DEFAULT_BASE}.{second}.0.0/16"


def check_pool(pool: str) -> str:
    """``pool`` normalised; raises ValueError unless it is an IPv4 network of at least
    one cluster subnet."""
    network = ipaddress.ip_network(pool, strict=False)
    if network.version != 4 or network.prefixlen > SUBNET_PREFIX:
        raise ValueError(f"{pool!r} must be an IPv4 network of /{SUBNET_PREFIX} or larger")
    return str(network)


def pick_subnet(
    pool: str,
    used: Iterable[str],
    choose: Callable[[Sequence[str]], str] = random.choice,
) -> str | None:
    """A /24 of ``pool`` that no subnet in ``used`` overlaps, picked by ``choose`` (at
    random: see :func:`default_pool`); None when the pool is full."""
    taken = [ipaddress.ip_network(u, strict=False) for u in used]
    free = [
        str(s)
        for s in ipaddress.ip_network(pool, strict=False).subnets(new_prefix=SUBNET_PREFIX)
        if not any(s.overlaps(t) for t in taken)
    ]
    return choose(free) if free else None


def gateway(subnet: str) -> str:
    """Each host's gateway on the cluster's network (the subnet's first address)."""
    return str(ipaddress.IPv4Network(subnet).network_address + 1)


def controller_address(subnet: str) -> str:
    """The controller's address: the subnet's last usable one."""
    return str(ipaddress.IPv4Network(subnet).broadcast_address - 1)


def worker_address(subnet: str, taken: Iterable[str]) -> str | None:
    """The lowest worker address of ``subnet`` not in ``taken``; None when none is left."""
    network = ipaddress.IPv4Network(subnet)
    held = set(taken) | {controller_address(subnet)}
    first = network.network_address + FIRST_WORKER_OFFSET
    last = network.broadcast_address - 1
    address = first
    while address < last:
        if str(address) not in held:
            return str(address)
        address += 1
    return None
