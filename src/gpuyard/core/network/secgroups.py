"""Security groups, pure: validating inbound rules and deciding whether one matches.

A security group is a list of inbound rules; a cluster has zero or more groups. With
no group at all every connection is allowed (nothing was asked for); as soon as one
group is attached, a connection is allowed only when some rule of some group allows
it, so a group with no rules denies everything. Rules only ever allow: there is no
deny rule and no ordering.

The stored and shown form of a rule is ``{"protocol": "tcp", "port_range": "8000-9000",
"source_cidr": "10.0.0.0/8"}``; ``rule_to_dict`` writes it canonically (a single port
as ``"22"``, a bare address as ``/32`` or ``/128``), and ``parse_rules`` reads it back
unchanged.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from gpuyard.core.errors import ValidationFailed

Protocol = Literal["tcp", "udp", "all"]
PROTOCOLS: tuple[Protocol, ...] = ("tcp", "udp", "all")
RULE_KEYS = ("protocol", "port_range", "source_cidr")
MIN_PORT = 1
MAX_PORT = 65535

# ASCII digits only: int() would also take "٢٢" or " 22 ".
_PORT_RANGE = re.compile(r"([0-9]{1,5})(?:-([0-9]{1,5}))?", re.ASCII)

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class Rule:
    """One inbound rule: ``protocol`` traffic to ports ``port_low..port_high`` (both
    included) from addresses in ``source``. Build it with ``parse_rules``, which
    guarantees ``1 <= port_low <= port_high <= 65535``."""

    protocol: Protocol
    port_low: int
    port_high: int
    source: Network

    def matches(
        self, protocol: str, port: int, source: ipaddress.IPv4Address | ipaddress.IPv6Address
    ) -> bool:
        """Whether this rule allows ``protocol`` traffic to ``port`` from ``source``
        (already unmapped: see ``allows``). Addresses of the other IP version never
        match, so ``0.0.0.0/0`` does not open a port to IPv6 clients."""
        return (
            (self.protocol == "all" or self.protocol == protocol)
            and self.port_low <= port <= self.port_high
            and source in self.source
        )


def parse_rules(raw: object) -> list[Rule]:
    """The rules of ``raw``, a list of rule dicts, in order.

    Raises ``ValidationFailed`` naming the first offending field (``rules``,
    ``rules[1]``, ``rules[1].port_range``...) when ``raw`` is not a list, a rule is
    not an object, has a missing or unknown key, an unknown protocol, a port outside
    1..65535 or a range whose low end is above its high end, or a source that is not
    a network. A bare address is taken as a single host; a network with host bits
    set (``10.0.0.1/8``) is refused rather than silently widened or narrowed.
    """
    if not isinstance(raw, list):
        raise ValidationFailed("rules", "must be a list of rules")
    return [_parse_rule(f"rules[{i}]", item) for i, item in enumerate(raw)]


def _parse_rule(field: str, raw: object) -> Rule:
    if not isinstance(raw, dict):
        raise ValidationFailed(
            field, "must be an object with keys protocol, port_range, source_cidr"
        )
    for key in raw:
        if key not in RULE_KEYS:
            raise ValidationFailed(
                f"{field}.{key}", "is not a field of a rule", {"allowed": list(RULE_KEYS)}
            )
    for key in RULE_KEYS:
        if key not in raw:
            raise ValidationFailed(f"{field}.{key}", "is required")
    low, high = _parse_port_range(f"{field}.port_range", raw["port_range"])
    return Rule(
        protocol=_parse_protocol(f"{field}.protocol", raw["protocol"]),
        port_low=low,
        port_high=high,
        source=_parse_source(f"{field}.source_cidr", raw["source_cidr"]),
    )


def _parse_protocol(field: str, value: object) -> Protocol:
    # Exact, lower-case names only: the stored form is compared as-is elsewhere.
    if not isinstance(value, str) or value not in PROTOCOLS:
        raise ValidationFailed(
            field,
            f"must be one of {', '.join(PROTOCOLS)}, got {value!r}",
            {"allowed": list(PROTOCOLS)},
        )
    return value


def _parse_port_range(field: str, value: object) -> tuple[int, int]:
    # An integer is accepted for a single port: JSON clients naturally send 22.
    if isinstance(value, int) and not isinstance(value, bool):
        low = high = value
    elif isinstance(value, str) and (m := _PORT_RANGE.fullmatch(value)):
        low = int(m.group(1))
        high = int(m.group(2)) if m.group(2) is not None else low
    else:
        raise ValidationFailed(field, f'must be a port or a range like "8000-9000", got {value!r}')
    for port in (low, high):
        if not MIN_PORT <= port <= MAX_PORT:
            raise ValidationFailed(field, f"port {port} is outside {MIN_PORT}..{MAX_PORT}")
    if low > high:
        raise ValidationFailed(field, f"low port {low} is above high port {high}")
    return low, high


def _parse_source(field: str, value: object) -> Network:
    # Only strings: ip_network() would also take an int or a tuple.
    if not isinstance(value, str):
        raise ValidationFailed(field, f'must be a CIDR like "10.0.0.0/8", got {value!r}')
    try:
        return ipaddress.ip_network(value, strict=True)
    except ValueError as exc:
        # ValueError covers both malformed text and host bits set; its text says which.
        raise ValidationFailed(field, f"is not a valid network: {exc}") from exc


def rule_to_dict(rule: Rule) -> dict[str, str]:
    """The canonical stored and shown form of ``rule``; ``parse_rules`` reads it back
    to an equal rule."""
    ports = str(rule.port_low)
    if rule.port_high != rule.port_low:
        ports += f"-{rule.port_high}"
    return {"protocol": rule.protocol, "port_range": ports, "source_cidr": str(rule.source)}


def allows(rule_sets: Sequence[Sequence[Rule]], protocol: str, port: int, source_ip: str) -> bool:
    """Whether a ``protocol`` ("tcp" or "udp") connection to ``port`` from
    ``source_ip`` is allowed by a cluster whose security groups hold ``rule_sets``.

    No groups: everything is allowed. Otherwise allowed iff some rule of some group
    matches. An IPv4-mapped IPv6 source (``::ffff:10.0.0.1``, what a dual-stack
    listener reports) is matched as its IPv4 address. A source that is not an IP
    address is denied when there are groups: fail closed.
    """
    if not rule_sets:
        return True
    try:
        address = ipaddress.ip_address(source_ip)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return any(rule.matches(protocol, port, address) for rules in rule_sets for rule in rules)


def allowed_sources(
    rule_sets: Sequence[Sequence[Rule]], protocol: str, port: int
) -> list[Network] | None:
    """The source networks a cluster whose security groups hold ``rule_sets`` lets
    reach ``port`` over ``protocol``, for a packet filter that can only match sources:
    None when there is no group (everything is allowed), else the sources of the rules
    that match the protocol and port, in order, without repeats (empty: nothing is
    allowed). ``allows(rule_sets, protocol, port, ip)`` is true exactly when the result
    is None or ``ip`` (unmapped) lies in one of the networks."""
    if not rule_sets:
        return None
    found: list[Network] = []
    for rules in rule_sets:
        for rule in rules:
            matches = rule.protocol in ("all", protocol) and rule.port_low <= port <= rule.port_high
            if matches and rule.source not in found:
                found.append(rule.source)
    return found
