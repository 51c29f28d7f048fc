"""IPv4 addresses carried inside IPv6 ones.

Several IPv6 forms are a way to reach an IPv4 address: a packet to them ends up at
(or is translated for) the IPv4 address they embed. Whoever decides whether an
address may be reached must decide on the embedded address too, or
``2002:7f00:1::1`` (6to4 of 127.0.0.1) slips past a check that refuses 127.0.0.1.

The forms (each judged by every address it may embed):

- IPv4-mapped ``::ffff:a.b.c.d`` and SIIT's IPv4-translated ``::ffff:0:a.b.c.d``;
- IPv4-compatible ``::a.b.c.d`` (deprecated; ``::`` and ``::1`` are not);
- 6to4 ``2002:AABB:CCDD::/48`` (RFC 3056);
- Teredo ``2001:0::/32`` (RFC 4380): the server, and the client, whose address is
  stored inverted ("obfuscated");
- NAT64 (RFC 6052): the well-known prefix ``64:ff9b::/96`` (the last 32 bits), and the
  local-use ``64:ff9b:1::/48`` (RFC 8215), whose operator may use a prefix of 48, 56,
  64 or 96 bits: every one of those embeddings is returned.
"""

from __future__ import annotations

from ipaddress import IPv4Address, IPv6Address, IPv6Network

MAPPED = IPv6Network("::ffff:0:0/96")
TRANSLATED = IPv6Network("::ffff:0:0:0/96")
COMPATIBLE = IPv6Network("::/96")
SIX_TO_FOUR = IPv6Network("2002::/16")
TEREDO = IPv6Network("2001::/32")
NAT64_WELL_KNOWN = IPv6Network("64:ff9b::/96")
NAT64_LOCAL = IPv6Network("64:ff9b:1::/48")

# RFC 6052 section 2.2: where the four IPv4 octets lie for each prefix length (bits
# 64..71, octet 8, are the reserved "u" octet and never hold address bits).
_RFC6052_OCTETS = {
    48: (6, 7, 9, 10),
    56: (7, 9, 10, 11),
    64: (9, 10, 11, 12),
    96: (12, 13, 14, 15),
}


def _octets(packed: bytes, positions: tuple[int, ...]) -> IPv4Address:
    return IPv4Address(bytes(packed[i] for i in positions))


def embedded_ipv4(addr: IPv6Address) -> tuple[IPv4Address, ...]:
    """Every IPv4 address ``addr`` embeds (see the module docstring), in a fixed
    order without repeats; empty when it is none of those forms."""
    packed = addr.packed
    found: list[IPv4Address] = []
    if (
        addr in MAPPED
        or addr in TRANSLATED
        or addr in NAT64_WELL_KNOWN
        or (addr in COMPATIBLE and int(addr) > 1)
    ):
        found.append(_octets(packed, _RFC6052_OCTETS[96]))
    elif addr in SIX_TO_FOUR:
        found.append(IPv4Address(packed[2:6]))
    elif addr in TEREDO:
        server = IPv4Address(packed[4:8])
        client = IPv4Address(bytes(b ^ 0xFF for b in packed[12:16]))
        found += [server, client]
    elif addr in NAT64_LOCAL:
        found += [_octets(packed, where) for where in _RFC6052_OCTETS.values()]
    return tuple(dict.fromkeys(found))
