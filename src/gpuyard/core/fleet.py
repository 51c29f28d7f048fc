"""The fleet's vocabulary: what an operator says about a host, and how placement
chooses among hosts. Pure; no I/O."""

from __future__ import annotations

from enum import StrEnum


class HostStatus(StrEnum):
    """The operator's word about a host (``hosts.status``); reachability is separate."""

    ACTIVE = "active"  # takes new placements
    CORDONED = "cordoned"  # keeps what it runs, takes nothing new
    DRAINING = "draining"  # cordoned, and its clusters are being moved away


class Reachability(StrEnum):
    """What the heartbeats say about a host's engine."""

    REACHABLE = "reachable"
    UNREACHABLE = "unreachable"
    UNKNOWN = "unknown"  # no heartbeat has reached it yet (a host just added)


class PlacementPolicy(StrEnum):
    """How placement scores the hosts a request fits on."""

    BINPACK = "binpack"  # fill the fullest host first: whole hosts stay free for big asks
    SPREAD = "spread"  # the emptiest host first: one host failing hits fewer clusters


def takes_placements(status: str, healthy: bool) -> bool:
    """Whether new clusters (or moves) may land on a host of ``status``."""
    return healthy and status == HostStatus.ACTIVE
