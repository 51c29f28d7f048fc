"""The host rules that keep account networks apart (runtimes/hosts/firewall.py), against a fake
iptables that keeps its chains in memory."""

from __future__ import annotations

from collections.abc import Sequence

from gpuyard.runtimes.hosts.firewall import (
    LOOPBACK_GUARD,
    CommandResult,
    IptablesIsolation,
    bridge_name,
    chain_name,
    drop_rule,
    jump_comes_first,
)


class FakeIptables:
    """Just enough of ``iptables -w`` (-S, -N, -C, -A, -I, -D, -F, -X; ``-t raw``) to
    run the rules. A chain of another table than filter is kept as ``table:CHAIN``."""

    def __init__(self, *, broken: bool = False) -> None:
        self.chains: dict[str, list[list[str]]] = {"FORWARD": [], "raw:PREROUTING": []}
        self.broken = broken
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str]) -> CommandResult:
        args = list(argv)
        self.calls.append(args)
        assert args[:3] == ["iptables", "-w", "5"]
        if self.broken:
            return CommandResult(4, "Permission denied (you must be root)")
        if args[3] == "-t":
            args = [*args[:3], *args[5:]]
            args[4] = f"{argv[4]}:{args[4]}"
        op, chain, rest = args[3], args[4], args[5:]
        rules = self.chains.get(chain)
        if op == "-N":
            if rules is not None:
                return CommandResult(1, "Chain already exists.")
            self.chains[chain] = []
            return CommandResult(0, "")
        if rules is None:
            return CommandResult(1, "No chain/target/match by that name.")
        if op == "-S":
            return CommandResult(0, "\n".join(f"-A {chain} {' '.join(r)}" for r in rules))
        if op == "-C":
            return CommandResult(0 if rest in rules else 1, "")
        if op == "-A":
            rules.append(rest)
        elif op == "-I":
            rules.insert(int(rest[0]) - 1, rest[1:])
        elif op == "-D":
            if rest not in rules:
                return CommandResult(1, "Bad rule")
            rules.remove(rest)
        elif op == "-F":
            rules.clear()
        elif op == "-X":
            del self.chains[chain]
        return CommandResult(0, "")


def test_bridge_names_fit_linux_interfaces_and_differ_per_network() -> None:
    names = {bridge_name(f"gy1a2b3c4d-net-a{i}") for i in range(1000)}
    assert len(names) == 1000
    assert all(len(n) <= 15 and n.startswith("gy") for n in names)
    assert bridge_name("x") == bridge_name("x")


def test_protect_jumps_first_and_closes_each_bridge_once() -> None:
    fake = FakeIptables()
    fake.chains["FORWARD"] = [["-j", "NETAVARK_FORWARD"]]
    iso = IptablesIsolation("1a2b3c4d", runner=fake, iptables="iptables")
    iso.protect(["gyaaa", "gybbb"])
    iso.protect(["gybbb", "gyccc"])
    chain = chain_name("1a2b3c4d")
    # Our jump comes before the engine's rules; nothing is doubled by a second call.
    assert fake.chains["FORWARD"] == [["-j", chain], ["-j", "NETAVARK_FORWARD"]]
    assert fake.chains[chain] == [drop_rule("gyaaa"), drop_rule("gybbb"), drop_rule("gyccc")]
    assert len(iso.rules()) == 3


def test_the_rule_lets_only_answers_and_published_ports_in_from_other_interfaces() -> None:
    rule = " ".join(drop_rule("gyaaa"))
    assert "-o gyaaa ! -i gyaaa" in rule
    # New connections and INVALID packets (an ACK scan) are dropped alike.
    assert "! --ctstate RELATED,ESTABLISHED,DNAT" in rule
    assert rule.endswith("-j DROP")


def test_packets_for_the_hosts_loopback_never_leave_a_bridge_of_ours() -> None:
    """A private port is published on 127.0.0.1: a container forging packets to it
    through its gateway is dropped before the engine's DNAT (raw PREROUTING)."""
    fake = FakeIptables()
    fake.chains["raw:PREROUTING"] = [["-j", "CT", "--notrack"]]
    one = IptablesIsolation("11111111", runner=fake, iptables="iptables")
    one.protect(["gyaaa"])
    one.protect(["gybbb"])
    IptablesIsolation("22222222", runner=fake, iptables="iptables").protect(["gyccc"])
    assert fake.chains["raw:PREROUTING"] == [LOOPBACK_GUARD, ["-j", "CT", "--notrack"]]
    rule = " ".join(LOOPBACK_GUARD)
    assert rule.startswith("-i gy+ -d 127.0.0.0/8") and rule.endswith("-j DROP")


def test_an_engine_jump_inserted_above_ours_is_put_back_below() -> None:
    fake = FakeIptables()
    iso = IptablesIsolation("1a2b3c4d", runner=fake, iptables="iptables")
    iso.protect(["gyaaa"])
    # The engine's first container start after a reboot puts its accepting jump on top.
    fake.chains["FORWARD"].insert(0, ["-j", "NETAVARK_FORWARD"])
    iso.keep_first()
    assert fake.chains["FORWARD"] == [["-j", iso.chain], ["-j", "NETAVARK_FORWARD"]]


def test_a_reload_that_flushed_our_rules_is_repaired() -> None:
    fake = FakeIptables()
    iso = IptablesIsolation("1a2b3c4d", runner=fake, iptables="iptables")
    iso.protect(["gyaaa"])
    fake.chains = {"FORWARD": [], "raw:PREROUTING": []}  # a firewall reload
    iso.protect(["gyaaa"])
    assert fake.chains["FORWARD"] == [["-j", iso.chain]]
    assert fake.chains[iso.chain] == [drop_rule("gyaaa")]
    assert fake.chains["raw:PREROUTING"] == [LOOPBACK_GUARD]


def test_remove_takes_out_the_chain_and_every_jump() -> None:
    fake = FakeIptables()
    iso = IptablesIsolation("1a2b3c4d", runner=fake, iptables="iptables")
    iso.protect(["gyaaa"])
    iso.remove()
    iso.remove()  # idempotent
    # The loopback guard is shared by every installation on the host: it stays.
    assert fake.chains == {"FORWARD": [], "raw:PREROUTING": [LOOPBACK_GUARD]}


def test_two_installations_keep_separate_chains() -> None:
    fake = FakeIptables()
    IptablesIsolation("11111111", runner=fake, iptables="iptables").protect(["gyaaa"])
    other = IptablesIsolation("22222222", runner=fake, iptables="iptables")
    other.protect(["gybbb"])
    other.remove()
    assert fake.chains[chain_name("11111111")] == [drop_rule("gyaaa")]


def test_without_root_it_says_why() -> None:
    iso = IptablesIsolation("1a2b3c4d", runner=FakeIptables(broken=True), iptables="iptables")
    problem = iso.available()
    assert problem is not None and "Permission denied" in problem


def test_another_installations_jump_above_ours_is_left_where_it_is() -> None:
    fake = FakeIptables()
    ours = IptablesIsolation("1a2b3c4d", runner=fake, iptables="iptables")
    other = IptablesIsolation("22222222", runner=fake, iptables="iptables")
    ours.protect(["gyaaa"])
    other.protect(["gybbb"])
    fake.chains["FORWARD"].append(["-j", "NETAVARK_FORWARD"])
    fake.calls.clear()
    # Both chains only drop: either order keeps both networks closed, so neither
    # installation moves its jump (they would take the top from each other at every
    # start); the check is one listing.
    ours.keep_first()
    other.keep_first()
    assert fake.chains["FORWARD"] == [
        ["-j", other.chain],
        ["-j", ours.chain],
        ["-j", "NETAVARK_FORWARD"],
    ]
    assert fake.calls == [["iptables", "-w", "5", "-S", "FORWARD"]] * 2


def test_an_engine_jump_between_two_installations_jumps_is_put_below_ours() -> None:
    fake = FakeIptables()
    ours = IptablesIsolation("1a2b3c4d", runner=fake, iptables="iptables")
    other = IptablesIsolation("22222222", runner=fake, iptables="iptables")
    ours.protect(["gyaaa"])
    other.protect(["gybbb"])
    fake.chains["FORWARD"].insert(1, ["-j", "NETAVARK_FORWARD"])
    ours.keep_first()
    assert fake.chains["FORWARD"][0] == ["-j", ours.chain]
    assert fake.chains["FORWARD"].index(["-j", "NETAVARK_FORWARD"]) == 2
    assert jump_comes_first(
        [f"-A FORWARD {' '.join(r)}" for r in fake.chains["FORWARD"]], other.chain
    )
    assert not jump_comes_first(["-A FORWARD -j NETAVARK_FORWARD"], ours.chain)
    assert not jump_comes_first([f"-A FORWARD -s 10.0.0.0/8 -j {other.chain}"], ours.chain)
