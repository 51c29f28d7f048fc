from __future__ import annotations

import ipaddress

import pytest

from gpuyard.core.errors import ValidationFailed
from gpuyard.core.network.secgroups import Rule, allows, parse_rules, rule_to_dict


def rule(
    protocol: object = "tcp", port_range: object = "22", source: object = "10.0.0.0/8"
) -> dict[str, object]:
    return {"protocol": protocol, "port_range": port_range, "source_cidr": source}


def one(**kw: object) -> Rule:
    (parsed,) = parse_rules([rule(**kw)])
    return parsed


def field_of(raw: object) -> str:
    with pytest.raises(ValidationFailed) as info:
        parse_rules(raw)
    assert info.value.details["field"] == info.value.field
    return info.value.field


# -- parsing -------------------------------------------------------------------


def test_parses_single_port_range_and_networks() -> None:
    rules = parse_rules(
        [
            rule(),
            rule("udp", "8000-9000", "192.168.1.0/24"),
            rule("all", "1-65535", "0.0.0.0/0"),
            rule("tcp", "443", "2001:db8::/32"),
        ]
    )
    assert rules == [
        Rule("tcp", 22, 22, ipaddress.ip_network("10.0.0.0/8")),
        Rule("udp", 8000, 9000, ipaddress.ip_network("192.168.1.0/24")),
        Rule("all", 1, 65535, ipaddress.ip_network("0.0.0.0/0")),
        Rule("tcp", 443, 443, ipaddress.ip_network("2001:db8::/32")),
    ]


def test_empty_list_is_no_rules() -> None:
    assert parse_rules([]) == []


def test_bare_address_is_a_single_host() -> None:
    assert one(source="10.1.2.3").source == ipaddress.ip_network("10.1.2.3/32")
    assert one(source="2001:db8::1").source == ipaddress.ip_network("2001:db8::1/128")


def test_integer_port_is_a_single_port() -> None:
    assert (one(port_range=22).port_low, one(port_range=22).port_high) == (22, 22)


def test_a_range_of_one_port_is_allowed() -> None:
    r = one(port_range="80-80")
    assert (r.port_low, r.port_high) == (80, 80)


def test_rule_to_dict_is_canonical_and_round_trips() -> None:
    assert rule_to_dict(one(port_range="80-80", source="10.1.2.3")) == {
        "protocol": "tcp",
        "port_range": "80",
        "source_cidr": "10.1.2.3/32",
    }
    assert rule_to_dict(one(protocol="all", port_range="1-1024", source="::/0")) == {
        "protocol": "all",
        "port_range": "1-1024",
        "source_cidr": "::/0",
    }
    rules = parse_rules([rule(), rule("udp", "5-6", "1.2.3.4"), rule("all", 7, "::1")])
    assert parse_rules([rule_to_dict(r) for r in rules]) == rules


@pytest.mark.parametrize("raw", [None, {}, "tcp:22", rule(), 3, ("a",)])
def test_not_a_list(raw: object) -> None:
    assert field_of(raw) == "rules"


@pytest.mark.parametrize("item", [None, "tcp 22", [1, 2], 5])
def test_a_rule_that_is_not_an_object(item: object) -> None:
    assert field_of([rule(), item]) == "rules[1]"


@pytest.mark.parametrize("key", ["protocol", "port_range", "source_cidr"])
def test_missing_key(key: str) -> None:
    raw = rule()
    del raw[key]
    assert field_of([rule(), rule(), raw]) == f"rules[2].{key}"


def test_unknown_key() -> None:
    raw = rule()
    raw["description"] = "ssh"
    with pytest.raises(ValidationFailed) as info:
        parse_rules([raw])
    assert info.value.field == "rules[0].description"
    assert info.value.details["allowed"] == ["protocol", "port_range", "source_cidr"]


@pytest.mark.parametrize("protocol", ["TCP", "icmp", "", None, 6, "tcp "])
def test_bad_protocol(protocol: object) -> None:
    assert field_of([rule(protocol=protocol)]) == "rules[0].protocol"


@pytest.mark.parametrize(
    "ports",
    [
        "0",
        "65536",
        "0-10",
        "10-65536",
        "9000-8000",
        "",
        "-",
        "22-",
        "-22",
        " 22",
        "22 - 23",
        "1-2-3",
        "abc",
        "٢٢",
        "22.0",
        "123456",
        0,
        65536,
        -1,
        True,
        22.0,
        None,
        [22],
    ],
)
def test_bad_port_range(ports: object) -> None:
    assert field_of([rule(port_range=ports)]) == "rules[0].port_range"


def test_port_range_bounds_are_inclusive() -> None:
    r = one(port_range="1-65535")
    assert (r.port_low, r.port_high) == (1, 65535)


@pytest.mark.parametrize(
    "source",
    [
        "10.0.0.1/8",  # host bits set: refused, never silently widened
        "2001:db8::1/32",
        "10.0.0.0/33",
        "300.1.1.1",
        "10.0.0",
        "",
        "any",
        " 10.0.0.0/8",
        167772160,  # an int is an address to ip_network(); not here
        None,
    ],
)
def test_bad_source(source: object) -> None:
    assert field_of([rule(source=source)]) == "rules[0].source_cidr"


def test_host_bits_error_says_so() -> None:
    with pytest.raises(ValidationFailed) as info:
        parse_rules([rule(source="10.0.0.1/8")])
    assert "host bits" in info.value.message


def test_the_first_bad_rule_is_named() -> None:
    assert field_of([rule(), rule(port_range="1-0"), rule(protocol="x")]) == "rules[1].port_range"


# -- matching ------------------------------------------------------------------

SSH_FROM_10 = [one()]  # tcp 22 from 10.0.0.0/8
WEB_ANYWHERE = [one(port_range="8000-9000", source="0.0.0.0/0")]


def test_no_groups_allow_everything() -> None:
    assert allows([], "tcp", 22, "203.0.113.9")
    assert allows((), "udp", 1, "::1")
    assert allows([], "tcp", 22, "not an address")


def test_a_group_with_no_rules_denies_everything() -> None:
    assert not allows([[]], "tcp", 22, "10.0.0.1")
    assert not allows([[], []], "udp", 53, "127.0.0.1")


def test_an_empty_group_next_to_a_real_one_changes_nothing() -> None:
    assert allows([[], SSH_FROM_10], "tcp", 22, "10.9.9.9")
    assert not allows([[], SSH_FROM_10], "tcp", 23, "10.9.9.9")


def test_source_must_be_in_the_network() -> None:
    assert allows([SSH_FROM_10], "tcp", 22, "10.0.0.0")
    assert allows([SSH_FROM_10], "tcp", 22, "10.255.255.255")
    assert not allows([SSH_FROM_10], "tcp", 22, "11.0.0.0")
    assert not allows([SSH_FROM_10], "tcp", 22, "9.255.255.255")


def test_port_range_edges() -> None:
    assert not allows([WEB_ANYWHERE], "tcp", 7999, "1.2.3.4")
    assert allows([WEB_ANYWHERE], "tcp", 8000, "1.2.3.4")
    assert allows([WEB_ANYWHERE], "tcp", 8500, "1.2.3.4")
    assert allows([WEB_ANYWHERE], "tcp", 9000, "1.2.3.4")
    assert not allows([WEB_ANYWHERE], "tcp", 9001, "1.2.3.4")


def test_single_port_rule() -> None:
    assert allows([SSH_FROM_10], "tcp", 22, "10.1.1.1")
    assert not allows([SSH_FROM_10], "tcp", 21, "10.1.1.1")
    assert not allows([SSH_FROM_10], "tcp", 23, "10.1.1.1")


def test_slash_zero_matches_every_address_of_its_version_only() -> None:
    v4_all = [one(source="0.0.0.0/0")]
    v6_all = [one(source="::/0")]
    assert allows([v4_all], "tcp", 22, "0.0.0.0")
    assert allows([v4_all], "tcp", 22, "255.255.255.255")
    assert not allows([v4_all], "tcp", 22, "2001:db8::1")
    assert allows([v6_all], "tcp", 22, "2001:db8::1")
    assert not allows([v6_all], "tcp", 22, "10.0.0.1")


def test_slash_32_matches_exactly_one_address() -> None:
    host = [one(source="10.0.0.5/32")]
    assert allows([host], "tcp", 22, "10.0.0.5")
    assert not allows([host], "tcp", 22, "10.0.0.4")
    assert not allows([host], "tcp", 22, "10.0.0.6")
    host6 = [one(source="2001:db8::5")]
    assert allows([host6], "tcp", 22, "2001:db8::5")
    assert not allows([host6], "tcp", 22, "2001:db8::6")


def test_protocol_all_matches_tcp_and_udp() -> None:
    any_proto = [one(protocol="all")]
    assert allows([any_proto], "tcp", 22, "10.0.0.1")
    assert allows([any_proto], "udp", 22, "10.0.0.1")


def test_a_udp_rule_does_not_allow_tcp() -> None:
    udp = [one(protocol="udp", port_range="1-65535", source="0.0.0.0/0")]
    assert allows([udp], "udp", 53, "10.0.0.1")
    assert not allows([udp], "tcp", 53, "10.0.0.1")


def test_a_tcp_rule_does_not_allow_udp() -> None:
    assert not allows([SSH_FROM_10], "udp", 22, "10.0.0.1")


def test_any_rule_of_any_group_allows() -> None:
    groups = [SSH_FROM_10, WEB_ANYWHERE]
    assert allows(groups, "tcp", 22, "10.0.0.1")
    assert allows(groups, "tcp", 8080, "198.51.100.1")
    assert not allows(groups, "tcp", 22, "198.51.100.1")
    several = [[one(port_range="1"), one(port_range="2"), one(port_range="3", source="1.2.3.4")]]
    assert allows(several, "tcp", 2, "10.0.0.1")
    assert allows(several, "tcp", 3, "1.2.3.4")
    assert not allows(several, "tcp", 3, "10.0.0.1")


def test_ipv4_mapped_source_counts_as_ipv4() -> None:
    assert allows([SSH_FROM_10], "tcp", 22, "::ffff:10.1.2.3")
    assert not allows([SSH_FROM_10], "tcp", 22, "::ffff:11.1.2.3")
    # ...and a mapped address is not matched by an IPv6 rule.
    assert not allows([[one(source="::/0")]], "tcp", 22, "::ffff:10.1.2.3")


def test_an_unparsable_source_is_denied_when_there_are_groups() -> None:
    assert not allows([WEB_ANYWHERE], "tcp", 8000, "")
    assert not allows([WEB_ANYWHERE], "tcp", 8000, "localhost")
