"""The training edge's host rules (runtimes/host_edge.py) against an in-memory iptables:
what each cluster's chains hold, where the jumps go, and that nothing of anybody else
is touched."""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence

import pytest

from gpuyard.core.secgroups import allowed_sources, allows, parse_rules
from gpuyard.runtimes.host_edge import (
    ClusterEdge,
    EdgeUnavailable,
    IptablesEdge,
    restore_script,
)
from gpuyard.runtimes.host_firewall import CommandResult

BUILTINS = {
    "nat": ("PREROUTING", "OUTPUT", "POSTROUTING"),
    "filter": ("INPUT", "OUTPUT", "FORWARD"),
}


class FakeIptables:
    """``iptables -w 5 [-t T] -S/-N/-X/-F/-C/-A/-D/-I``, ``iptables-restore --noflush``
    (through ``sh -c`` with a here-document) and ``sysctl``, on in-memory tables."""

    def __init__(self) -> None:
        self.tables: dict[str, dict[str, list[str]]] = {
            t: {c: [] for c in chains} for t, chains in BUILTINS.items()
        }
        self.commands: list[list[str]] = []
        self.broken_restore = False

    def __call__(self, argv: Sequence[str]) -> CommandResult:
        argv = list(argv)
        self.commands.append(argv)
        if argv[0] == "sysctl":
            return CommandResult(0, "")
        if argv[:2] == ["sh", "-c"]:
            return self._restore(argv[2])
        assert argv[:3] == ["iptables", "-w", "5"], argv
        args = argv[3:]
        table = "filter"
        if args[0] == "-t":
            table, args = args[1], args[2:]
        chains = self.tables[table]
        op, chain, rest = args[0], args[1], args[2:]
        if op == "-N":
            if chain in chains:
                return CommandResult(1, "Chain already exists.")
            chains[chain] = []
            return CommandResult(0, "")
        if chain not in chains:
            return CommandResult(1, f"No chain/target/match by that name: {chain}")
        rule = f"-A {chain} {' '.join(rest)}"
        if op == "-S":
            head = [] if chain in BUILTINS[table] else [f"-N {chain}"]
            return CommandResult(0, "\n".join(head + chains[chain]))
        if op == "-X":
            if chains[chain] or any(f"-j {chain}" in r for c in chains.values() for r in c):
                return CommandResult(1, "Device or resource busy")
            del chains[chain]
        elif op == "-F":
            chains[chain].clear()
        elif op == "-C":
            return CommandResult(0 if rule in chains[chain] else 1, "")
        elif op == "-A":
            chains[chain].append(rule)
        elif op == "-D":
            if rule not in chains[chain]:
                return CommandResult(1, "Bad rule")
            chains[chain].remove(rule)
        elif op == "-I":
            position, rest = int(rest[0]), rest[1:]
            chains[chain].insert(position - 1, f"-A {chain} {' '.join(rest)}")
        return CommandResult(0, "")

    def _restore(self, script: str) -> CommandResult:
        first, _, body = script.partition("\n")
        assert shlex.split(first)[:4] == ["iptables-restore", "-w", "5", "--noflush"], first
        if self.broken_restore:
            return CommandResult(2, "iptables-restore: line 3 failed")
        table = ""
        for line in body.splitlines():
            if line.startswith("*"):
                table = line[1:]
            elif line.startswith(":"):
                self.tables[table][line[1:].split()[0]] = []  # declared: made or flushed
            elif line.startswith("-A "):
                # Rules as -S prints them: quotes around a comment with spaces stay.
                self.tables[table][line.split()[1]].append(line)
        return CommandResult(0, "")

    def rules(self, table: str, chain: str) -> list[str]:
        return self.tables[table].get(chain, [])


def edge(
    cluster_id: int = 5,
    *,
    listeners: frozenset[tuple[str, int]] = frozenset({("0.0.0.0", 40022), ("127.0.10.1", 22)}),
    sources: tuple[str, ...] | None = None,
    target: str = "10.89.0.2",
) -> ClusterEdge:
    return ClusterEdge(
        cluster_id=cluster_id,
        target=target,
        target_port=22,
        listeners=listeners,
        sources=sources,
        bridge="gy0123456789ab",
    )


def test_each_listener_is_a_dnat_to_the_controller_and_loopback_clients_are_masqueraded() -> None:
    script = restore_script("abcd1234", edge())
    assert (
        "-A GY-E-abcd1234-5 -m addrtype --dst-type LOCAL -p tcp -m tcp --dport 40022 -m comment "
        '--comment "gpuyard training 5" -j DNAT --to-destination 10.89.0.2:22'
    ) in script
    assert "-A GY-E-abcd1234-5 -d 127.0.10.1/32 -p tcp -m tcp --dport 22 " in script
    assert re.search(
        r"-A GY-M-abcd1234-5 -s 127\.0\.0\.0/8 -d 10\.89\.0\.2/32 .*--ctstate DNAT .*MASQUERADE",
        script,
    )
    # No security group: nothing filters.
    assert "REJECT" not in script and "RETURN" not in script


def test_security_groups_become_allowed_sources_then_a_reset_for_every_packet() -> None:
    script = restore_script("abcd1234", edge(sources=("127.0.0.2/32", "10.0.0.0/8", "::/0")))
    filt = script[script.index("*filter") :].splitlines()
    rules = [line for line in filt if line.startswith("-A ")]
    assert len(rules) == 3  # the IPv6 source cannot match an IPv4 edge: left out
    assert "--ctorigsrc 127.0.0.2/32" in rules[0] and rules[0].endswith("-j RETURN")
    assert "--ctorigsrc 10.0.0.0/8" in rules[1] and rules[1].endswith("-j RETURN")
    # Every packet of a connection DNAT-ed to this controller, either way, but resets.
    assert "--ctstate DNAT --ctreplsrc 10.89.0.2/32 --ctreplsrcport 22" in rules[2]
    assert "! --tcp-flags RST RST" in rules[2]
    assert rules[2].endswith("-j REJECT --reject-with tcp-reset")
    # A group with no rule for port 22: nobody.
    nobody = restore_script("abcd1234", edge(sources=())).splitlines()
    assert not [line for line in nobody if "RETURN" in line]
    assert len([line for line in nobody if "REJECT" in line]) == 1


def test_an_address_that_is_not_an_ipv4_address_never_reaches_the_shell() -> None:
    with pytest.raises(ValueError):
        restore_script("abcd1234", edge(target="10.0.0.1; reboot"))
    with pytest.raises(ValueError):
        restore_script("abcd1234", edge(listeners=frozenset({("$(reboot)", 22)})))


@pytest.mark.parametrize(
    "raw",
    [
        [],
        [{"protocol": "tcp", "port_range": "22", "source_cidr": "127.0.0.2/32"}],
        [{"protocol": "udp", "port_range": "22", "source_cidr": "10.0.0.0/8"}],
        [{"protocol": "all", "port_range": "1-100", "source_cidr": "10.1.0.0/16"}],
        [{"protocol": "tcp", "port_range": "80", "source_cidr": "0.0.0.0/0"}],
    ],
)
def test_allowed_sources_agree_with_allows(raw: list[dict[str, str]]) -> None:
    import ipaddress

    rule_sets = [parse_rules(raw)]
    sources = allowed_sources(rule_sets, "tcp", 22)
    assert sources is not None
    for ip in ("127.0.0.2", "127.0.0.3", "10.1.2.3", "10.200.0.1", "192.0.2.1"):
        inside = any(ipaddress.ip_address(ip) in n for n in sources)
        assert inside == allows(rule_sets, "tcp", 22, ip), ip
    assert allowed_sources([], "tcp", 22) is None  # no group: open


def test_apply_writes_the_chains_and_jumps_once_after_the_isolation_chain() -> None:
    ipt = FakeIptables()
    ipt.tables["filter"]["GY-ISO-abcd1234"] = []
    ipt.tables["filter"]["FORWARD"] = ["-A FORWARD -j GY-ISO-abcd1234", "-A FORWARD -j NETAVARK"]
    rules = IptablesEdge("abcd1234", runner=ipt)
    rules.apply(edge(sources=("127.0.0.2/32",)))
    rules.apply(edge(sources=("127.0.0.2/32",)))  # idempotent
    assert ipt.rules("filter", "FORWARD") == [
        "-A FORWARD -j GY-ISO-abcd1234",
        "-A FORWARD -j GY-EDGE-abcd1234",
        "-A FORWARD -j NETAVARK",
    ]
    for table, chains in BUILTINS.items():
        for chain in chains:
            jump = "GY-EMASQ-abcd1234" if chain == "POSTROUTING" else "GY-EDGE-abcd1234"
            assert ipt.rules(table, chain).count(f"-A {chain} -j {jump}") == 1, (table, chain)
    assert ipt.rules("nat", "GY-EDGE-abcd1234") == ["-A GY-EDGE-abcd1234 -j GY-E-abcd1234-5"]
    assert ipt.rules("nat", "GY-EMASQ-abcd1234") == ["-A GY-EMASQ-abcd1234 -j GY-M-abcd1234-5"]
    assert ipt.rules("filter", "GY-EDGE-abcd1234") == ["-A GY-EDGE-abcd1234 -j GY-E-abcd1234-5"]
    assert len(ipt.rules("nat", "GY-E-abcd1234-5")) == 2
    assert len(ipt.rules("filter", "GY-E-abcd1234-5")) == 2
    assert ["sysctl", "-q", "-w", "net.ipv4.conf.gy0123456789ab.route_localnet=1"] in ipt.commands
    # A rule change rewrites the cluster's chain: no rule of the old set is left.
    rules.apply(edge(sources=None))
    assert ipt.rules("filter", "GY-E-abcd1234-5") == []
    assert rules.clusters() == {5}


def test_an_engine_jump_inserted_above_ours_is_put_back_below() -> None:
    ipt = FakeIptables()
    rules = IptablesEdge("abcd1234", runner=ipt)
    rules.apply(edge())
    ipt.tables["nat"]["PREROUTING"].insert(0, "-A PREROUTING -j NETAVARK-HOSTPORT-DNAT")
    rules.apply(edge())
    assert ipt.rules("nat", "PREROUTING") == [
        "-A PREROUTING -j GY-EDGE-abcd1234",
        "-A PREROUTING -j NETAVARK-HOSTPORT-DNAT",
    ]


def test_remove_and_uninstall_touch_only_our_rules() -> None:
    ipt = FakeIptables()
    ipt.tables["nat"]["OUTPUT"] = ["-A OUTPUT -j SOMEONE-ELSE"]
    ours = IptablesEdge("abcd1234", runner=ipt)
    theirs = IptablesEdge("99999999", runner=ipt)
    ours.apply(edge(5))
    ours.apply(edge(6, target="10.89.1.2"))
    theirs.apply(edge(5))
    ours.remove(5)
    assert ours.clusters() == {6} and theirs.clusters() == {5}
    assert "GY-E-abcd1234-5" not in ipt.tables["nat"] | ipt.tables["filter"]
    ours.remove(5)  # idempotent
    ours.uninstall()
    assert ours.clusters() == set() and theirs.clusters() == {5}
    assert not any(
        "abcd1234" in name or any("abcd1234" in r for r in chain)
        for table in ipt.tables.values()
        for name, chain in table.items()
    )
    assert ipt.rules("nat", "OUTPUT") == [
        "-A OUTPUT -j GY-EDGE-99999999",
        "-A OUTPUT -j SOMEONE-ELSE",
    ]


def test_a_firewall_that_refuses_says_why() -> None:
    ipt = FakeIptables()
    ipt.broken_restore = True
    with pytest.raises(EdgeUnavailable, match="training cluster 5: iptables-restore: line 3"):
        IptablesEdge("abcd1234", runner=ipt).apply(edge())
