"""Webhook targets given as IPv6 addresses that embed an IPv4 address are judged by
the embedded address (core/network/embedded_ipv4.py, services/tenancy/webhooks.py)."""

from __future__ import annotations

from ipaddress import IPv4Address, IPv6Address

import pytest

from gpuyard.core.errors import ValidationFailed
from gpuyard.core.network.embedded_ipv4 import embedded_ipv4
from gpuyard.services.tenancy.webhooks import check_target


def _teredo(server: str, client: str) -> str:
    """A Teredo address (RFC 4380): 2001:0:<server>:<flags>:<port ^ ffff>:<client ^
    ffffffff> — the client's address is stored inverted."""
    s = IPv4Address(server).packed
    c = bytes(b ^ 0xFF for b in IPv4Address(client).packed)
    raw = bytes.fromhex("20010000") + s + bytes.fromhex("8000") + bytes.fromhex("63bf") + c
    return str(IPv6Address(raw))


def _nat64_local(v4: str, prefix_bits: int) -> str:
    """``v4`` embedded in 64:ff9b:1::/48 at RFC 6052's place for ``prefix_bits``."""
    raw = bytearray(IPv6Address("64:ff9b:1::").packed)
    where = {48: (6, 7, 9, 10), 56: (7, 9, 10, 11), 64: (9, 10, 11, 12), 96: (12, 13, 14, 15)}
    for i, octet in zip(where[prefix_bits], IPv4Address(v4).packed, strict=True):
        raw[i] = octet
    return str(IPv6Address(bytes(raw)))


LOOPBACK_EMBEDDED = {
    "6to4": "2002:7f00:1::1",
    "6to4 private": "2002:a00:1::1",
    "6to4 metadata": "2002:a9fe:a9fe::1",
    "nat64 well-known": "64:ff9b::7f00:1",
    "nat64 well-known private": "64:ff9b::c0a8:101",
    "nat64 local /48": _nat64_local("127.0.0.1", 48),
    "nat64 local /56": _nat64_local("10.0.0.1", 56),
    "nat64 local /64": _nat64_local("169.254.169.254", 64),
    "nat64 local /96": _nat64_local("127.0.0.1", 96),
    "teredo client": _teredo("8.8.8.8", "127.0.0.1"),
    "teredo client private": _teredo("8.8.4.4", "192.168.1.1"),
    "teredo server": _teredo("10.0.0.1", "8.8.8.8"),
    "ipv4-mapped": "::ffff:127.0.0.1",
    "ipv4-mapped private": "::ffff:10.0.0.1",
    "ipv4-translated": "::ffff:0:7f00:1",
    "ipv4-compatible": "::127.0.0.1",
    "ipv4-compatible private": "::172.16.0.1",
}


@pytest.mark.parametrize("address", LOOPBACK_EMBEDDED.values(), ids=LOOPBACK_EMBEDDED.keys())
def test_embedded_non_public_ipv4_is_refused(address: str) -> None:
    with pytest.raises(ValidationFailed) as exc:
        check_target(
            "https://hooks.example/x", allow_private=False, resolver=lambda h, p: [address]
        )
    assert exc.value.details["field"] == "webhook_url"
    assert "embedding" in exc.value.message
    # Also as a literal in the URL (the finding: http://[2002:7f00:1::1]/).
    with pytest.raises(ValidationFailed):
        check_target(f"http://[{address}]/", allow_private=False)
    # The operator may allow private targets.
    assert check_target(f"http://[{address}]/", allow_private=True).address == address


PUBLIC_EMBEDDED = {
    "6to4": "2002:808:808::1",
    "nat64 well-known": "64:ff9b::808:808",
    "teredo": _teredo("8.8.8.8", "1.1.1.1"),
}


@pytest.mark.parametrize("address", PUBLIC_EMBEDDED.values(), ids=PUBLIC_EMBEDDED.keys())
def test_embedded_public_ipv4_is_judged_public(address: str) -> None:
    assert check_target(f"http://[{address}]/", allow_private=False).address == address


def test_embedded_addresses_of_each_form() -> None:
    def of(address: str) -> list[str]:
        return [str(a) for a in embedded_ipv4(IPv6Address(address))]

    assert of("2002:7f00:1::1") == ["127.0.0.1"]
    assert of("64:ff9b::7f00:1") == ["127.0.0.1"]
    assert of("::ffff:7f00:1") == ["127.0.0.1"]
    assert of("::ffff:0:7f00:1") == ["127.0.0.1"]
    assert of("::7f00:1") == ["127.0.0.1"]
    # Teredo: the server as written, the client inverted back.
    assert of("2001:0:4136:e378:8000:63bf:80ff:fffe") == ["65.54.227.120", "127.0.0.1"]
    # Local-use NAT64: every prefix length's embedding (one of them is the real one).
    assert "127.0.0.1" in of(_nat64_local("127.0.0.1", 56))
    # Not an embedding form (and :: / ::1 are themselves, not IPv4-compatible).
    assert of("2606:4700::1111") == []
    assert of("::") == [] and of("::1") == []
    assert of("fd00::7f00:1") == []
