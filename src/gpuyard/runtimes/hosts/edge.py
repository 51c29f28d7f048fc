"""A training cluster's SSH endpoint and reserved IPs, served by the kernel of the host
its controller runs on: DNAT rules in this installation's own chains, with the
cluster's security groups as source filters.

Nothing of a user's connection passes through the control plane: once a cluster's
rules are in place, the API process may stop, crash or be ``kill -9``-ed and every open
session goes on (the rules and the connections' conntrack entries live in the host's
kernel). Per cluster ``C`` of installation ``S`` (``owner.short``) this module keeps:

* ``nat GY-E-S-C``: one DNAT rule per listener, ``listen address:port`` to the
  controller's ``address:22`` (``0.0.0.0`` listens on every local address, as a bound
  socket would);
* ``nat GY-M-S-C``: masquerade for clients on the host's loopback (the controller
  could not answer ``127.0.0.x``); it needs ``route_localnet`` on the cluster's bridge,
  which this module turns on, as Podman does for a port published on 127.0.0.1 (the
  isolation chain's loopback guard, runtimes/hosts/firewall.py, is what makes that
  safe);
* ``filter GY-E-S-C``: with security groups, every packet of a connection DNAT-ed to
  the controller's SSH, in either direction, returns when its client's address is an
  allowed source and is otherwise refused with a TCP reset: a rule change reaches the
  connections already open at their next packet (the side that sends it gets the
  reset), and no byte of a denied session flows after the change;

and the installation's chains ``GY-EDGE-S`` (nat, jumped from ``PREROUTING`` and
``OUTPUT``; filter, jumped from ``INPUT``, ``OUTPUT`` and ``FORWARD``) and
``GY-EMASQ-S`` (nat ``POSTROUTING``), which jump to each cluster's. A cluster's chains
are rewritten in one ``iptables-restore --noflush`` per table (declaring a chain there
flushes it, so each table's change is atomic); rules this installation did not make
are never touched.

Commands run through the runner of the host's isolation chain (runtimes/hosts/firewall.py):
this machine's shell, or the SSH connection that reaches a fleet host's engine.
"""

from __future__ import annotations

import ipaddress
import re
import shlex
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from gpuyard.runtimes.hosts.firewall import CommandResult, Runner, subprocess_runner

ANY_ADDRESS = "0.0.0.0"
_CLUSTER_CHAIN = re.compile(r"^-A \S+ -j GY-E-[0-9A-Za-z]+-([0-9]+)$")


class EdgeUnavailable(Exception):
    """The host's firewall could not be changed (no iptables, not root, a bad rule)."""


@dataclass(frozen=True)
class ClusterEdge:
    """What one cluster's edge on its controller's host must be.

    ``listeners``: ``(address, port)`` pairs that reach ``target:target_port``
    (``0.0.0.0``: every local address). ``sources``: None lets every client in (no
    security group); otherwise only clients in these networks (empty: nobody).
    ``bridge``: the cluster network's bridge interface (runtimes/hosts/firewall.py
    bridge_name), where loopback clients' packets leave the host."""

    cluster_id: int
    target: str
    target_port: int
    listeners: frozenset[tuple[str, int]]
    sources: tuple[str, ...] | None
    bridge: str


def chains(short: str, cluster_id: int) -> tuple[str, str]:
    """The cluster's DNAT/filter chain and its masquerade chain (at most 28 characters
    for an 8-character ``short`` and any 32-bit cluster id)."""
    return f"GY-E-{short}-{cluster_id}", f"GY-M-{short}-{cluster_id}"


def installation_chains(short: str) -> tuple[str, str]:
    """The installation's jump chains: ``GY-EDGE-S`` (nat and filter) and ``GY-EMASQ-S``."""
    return f"GY-EDGE-{short}", f"GY-EMASQ-{short}"


def restore_script(short: str, edge: ClusterEdge) -> str:
    """The ``iptables-restore --noflush`` input that makes the cluster's chains exactly
    ``edge`` (each chain declared, hence flushed, then filled)."""
    main, masq = chains(short, edge.cluster_id)
    target = f"{edge.target}:{edge.target_port}"
    comment = f'-m comment --comment "gpuyard training {edge.cluster_id}"'
    nat = ["*nat", f":{main} - [0:0]", f":{masq} - [0:0]"]
    for address, port in sorted(edge.listeners):
        match = (
            "-m addrtype --dst-type LOCAL" if address == ANY_ADDRESS else f"-d {_host(address)}/32"
        )
        nat.append(
            f"-A {main} {match} -p tcp -m tcp --dport {port} {comment} "
            f"-j DNAT --to-destination {target}"
        )
    nat.append(
        f"-A {masq} -s 127.0.0.0/8 -d {_host(edge.target)}/32 -p tcp -m tcp "
        f"--dport {edge.target_port} -m conntrack --ctstate DNAT {comment} -j MASQUERADE"
    )
    nat.append("COMMIT")
    flow = (
        f"-m conntrack --ctstate DNAT --ctreplsrc {_host(edge.target)}/32 "
        f"--ctreplsrcport {edge.target_port}"
    )
    filt = ["*filter", f":{main} - [0:0]"]
    if edge.sources is not None:
        for source in edge.sources:
            network = ipaddress.ip_network(source)
            if network.version != 4:
                continue  # the edge is IPv4: an IPv6 source never matches it
            filt.append(f"-A {main} -p tcp {flow} --ctorigsrc {network} {comment} -j RETURN")
        # A reset passes: the one REJECT sends is a packet of the same connection, and
        # refusing it would keep it from the side it tells to close.
        filt.append(
            f"-A {main} -p tcp -m tcp ! --tcp-flags RST RST {flow} {comment} "
            "-j REJECT --reject-with tcp-reset"
        )
    filt.append("COMMIT")
    return "\n".join([*nat, *filt]) + "\n"


def _host(address: str) -> str:
    """``address`` checked to be an IPv4 address (it goes into a shell script)."""
    return str(ipaddress.IPv4Address(address))


Tables = dict[str, dict[str, list[str]]]
"""table -> chain -> its rules as ``iptables-save`` prints them (``-A CHAIN ...``)."""

_TABLES = ("nat", "filter")


def parse_save(text: str) -> Tables:
    """The nat and filter tables of ``iptables-save`` output (other tables ignored)."""
    tables: Tables = {t: {} for t in _TABLES}
    current: dict[str, list[str]] | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("*"):
            current = tables.get(line[1:])
        elif current is None:
            continue
        elif line.startswith(":"):
            current.setdefault(line[1:].split()[0], [])
        elif line.startswith("-A "):
            current.setdefault(line.split()[1], []).append(line)
    return tables


def _jumps(edge_chain: str, masq_chain: str) -> Sequence[tuple[str, str, str]]:
    """(table, built-in chain, our chain) for every jump the installation keeps."""
    return (
        ("nat", "PREROUTING", edge_chain),
        ("nat", "OUTPUT", edge_chain),
        ("nat", "POSTROUTING", masq_chain),
        ("filter", "INPUT", edge_chain),
        ("filter", "OUTPUT", edge_chain),
        ("filter", "FORWARD", edge_chain),
    )


class IptablesEdge:
    """Training clusters' edges on one host, kept with ``iptables-save`` and
    ``iptables-restore --noflush``: every change is one read and one write, each table's
    part of the write atomic (two commands per sync, which matters over SSH).
    Thread-safe; every method is idempotent."""

    def __init__(
        self,
        short: str,
        *,
        runner: Runner = subprocess_runner,
        iptables: str = "iptables",
    ) -> None:
        if not re.fullmatch(r"[0-9A-Za-z]{1,8}", short):
            raise ValueError(f"installation short id must be 1-8 letters or digits: {short!r}")
        self.short = short
        self._run = runner
        self._iptables = iptables
        self._lock = threading.Lock()

    # -- reading -----------------------------------------------------------------

    def _state(self) -> Tables:
        save = shlex.quote(f"{self._iptables}-save")
        read = self._run(["sh", "-c", f"{save} -t nat && {save} -t filter"])
        self._must(read, "reading the host firewall")
        return parse_save(read.output)

    def clusters(self) -> set[int]:
        """The ids of the clusters with rules here (the nat chain's jumps). Raises
        EdgeUnavailable when the firewall cannot be read."""
        with self._lock:
            return self._clusters(self._state())

    def _clusters(self, state: Tables) -> set[int]:
        edge_chain, _ = installation_chains(self.short)
        return {
            int(m.group(1))
            for line in state["nat"].get(edge_chain, [])
            if (m := _CLUSTER_CHAIN.match(line.strip()))
        }

    # -- changing ----------------------------------------------------------------

    def apply(self, edge: ClusterEdge) -> None:
        """Make the cluster's rules exactly ``edge``: its chains rewritten, jumped to
        from the installation's chains, which come first in the built-in chains (after
        other gpuyard jumps). Raises EdgeUnavailable when the firewall cannot be
        changed."""
        rules = restore_script(self.short, edge).splitlines()
        nat_end, filter_end = rules.index("COMMIT"), len(rules) - 1
        with self._lock:
            state = self._state()
            wanted = self._clusters(state) | {edge.cluster_id}
            nat = rules[:nat_end] + self._installation("nat", state, wanted) + ["COMMIT"]
            filt = (
                rules[nat_end + 1 : filter_end]
                + self._installation("filter", state, wanted)
                + ["COMMIT"]
            )
            # The bridge may not be there yet (no container started): the sysctl then
            # fails, and the next sync (every scan) sets it.
            sysctl = f"net.ipv4.conf.{edge.bridge}.route_localnet=1"
            done = self._restore(nat + filt, before=f"sysctl -q -w {shlex.quote(sysctl)};")
            self._must(done, f"writing the rules of training cluster {edge.cluster_id}")

    def remove(self, cluster_id: int) -> None:
        """Delete the cluster's rules and chains (nothing reaches it any more); open
        connections lose their translation and are reset at their next packet.
        Raises EdgeUnavailable when the firewall cannot be changed."""
        main, masq = chains(self.short, cluster_id)
        with self._lock:
            state = self._state()
            if not any(c in state[t] for t, c in (("nat", main), ("nat", masq), ("filter", main))):
                return
            wanted = self._clusters(state) - {cluster_id}
            lines: list[str] = []
            for table, ours in (("nat", (main, masq)), ("filter", (main,))):
                lines.append(f"*{table}")
                lines += self._installation(table, state, wanted)
                gone = [c for c in ours if c in state[table]]
                lines += [f":{c} - [0:0]" for c in gone] + [f"-X {c}" for c in gone]
                lines.append("COMMIT")
            self._must(self._restore(lines), f"deleting the rules of training cluster {cluster_id}")

    def uninstall(self) -> None:
        """Every rule and chain of this installation's edge, gone (tests, uninstall).
        Raises EdgeUnavailable when the firewall cannot be changed."""
        edge_chain, masq_chain = installation_chains(self.short)
        prefixes = (f"GY-E-{self.short}-", f"GY-M-{self.short}-")
        with self._lock:
            state = self._state()
            lines: list[str] = []
            for table in _TABLES:
                ours = [
                    c
                    for c in state[table]
                    if c in (edge_chain, masq_chain) or c.startswith(prefixes)
                ]
                if not ours:
                    continue
                lines.append(f"*{table}")
                for t, builtin, chain in _jumps(edge_chain, masq_chain):
                    if t == table:
                        rule = f"-A {builtin} -j {chain}"
                        lines += [f"-D {builtin} -j {chain}"] * state[t].get(builtin, []).count(
                            rule
                        )
                lines += [f":{c} - [0:0]" for c in ours]  # flushed: no jump left
                lines += [f"-X {c}" for c in ours]
                lines.append("COMMIT")
            if lines:
                self._must(self._restore(lines), "removing the training edge's rules")

    def _installation(self, table: str, state: Tables, clusters: set[int]) -> list[str]:
        """Restore lines that make the installation's chains of ``table`` jump to exactly
        ``clusters``' chains and be jumped to first from the built-in chains."""
        edge_chain, masq_chain = installation_chains(self.short)
        lines: list[str] = []
        for chain, kind in ((edge_chain, "E"), (masq_chain, "M")):
            if table == "filter" and kind == "M":
                continue
            want = [f"-A {chain} -j GY-{kind}-{self.short}-{c}" for c in sorted(clusters)]
            if state[table].get(chain) != want:
                # Declaring it flushes it: the new list of jumps lands at once.
                lines.append(f":{chain} - [0:0]")
                lines += want
        for t, builtin, chain in _jumps(edge_chain, masq_chain):
            if t == table:
                lines += _keep_first(state[table].get(builtin, []), builtin, chain)
        return lines

    def _restore(self, lines: list[str], before: str = "") -> CommandResult:
        restore = shlex.quote(f"{self._iptables}-restore")
        body = "\n".join(lines)
        return self._run(
            ["sh", "-c", f"{before}{restore} -w 5 --noflush <<'GPUYARD_EOF'\n{body}\nGPUYARD_EOF\n"]
        )

    @staticmethod
    def _must(result: CommandResult, doing: str) -> None:
        if result.returncode != 0:
            raise EdgeUnavailable(f"{doing}: {result.output.strip() or 'iptables failed'}")


def _keep_first(rules: list[str], builtin: str, chain: str) -> list[str]:
    """Restore lines that put our jump before every rule of ``builtin`` but other
    gpuyard jumps (nothing when it is there). The engine inserts its own jumps at the
    top when they are missing, and above ours they could accept a denied flow; the
    isolation chain (runtimes/hosts/firewall.py) keeps itself first, and both only drop
    or refuse, so their order does not matter."""
    ours = f"-A {builtin} -j {chain}"
    lead = 0
    while lead < len(rules) and rules[lead].startswith(f"-A {builtin} -j GY-"):
        if rules[lead] == ours:
            return []
        lead += 1
    # Any copy further down goes (it is below the lead, so the position holds).
    return [f"-D {builtin} -j {chain}"] * rules.count(ours) + [
        f"-I {builtin} {lead + 1} -j {chain}"
    ]
