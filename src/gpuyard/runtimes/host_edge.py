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
  isolation chain's loopback guard, runtimes/host_firewall.py, is what makes that
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

Commands run through the runner of the host's isolation chain (runtimes/host_firewall.py):
this machine's shell, or the SSH connection that reaches a fleet host's engine.
"""

from __future__ import annotations

import ipaddress
import re
import shlex
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from gpuyard.runtimes.host_firewall import CommandResult, Runner, subprocess_runner

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
    ``bridge``: the cluster network's bridge interface (runtimes/host_firewall.py
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


class IptablesEdge:
    """Training clusters' edges on one host, kept with ``iptables``. Thread-safe;
    every method is idempotent."""

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

    def _ipt(self, *args: str) -> CommandResult:
        return self._run([self._iptables, "-w", "5", *args])

    def apply(self, edge: ClusterEdge) -> None:
        """Make the cluster's rules exactly ``edge``: its chains rewritten atomically,
        then jumped to from the installation's chains, which are first in the built-in
        chains. Raises EdgeUnavailable when the firewall cannot be changed."""
        script = restore_script(self.short, edge)
        restore = f"{self._iptables}-restore"
        sysctl = f"net.ipv4.conf.{edge.bridge}.route_localnet=1"
        with self._lock:
            # A bridge that is not there yet (no container started): the sysctl fails;
            # the next apply (every scan) sets it.
            self._run(["sysctl", "-q", "-w", sysctl])
            done = self._run(
                [
                    "sh",
                    "-c",
                    f"{shlex.quote(restore)} -w 5 --noflush <<'GPUYARD_EOF'\n{script}GPUYARD_EOF\n",
                ]
            )
            self._must(done, f"writing the rules of training cluster {edge.cluster_id}")
            self._ensure_jumps(edge.cluster_id)

    def remove(self, cluster_id: int) -> None:
        """Delete the cluster's rules and chains (nothing reaches it any more); open
        connections lose their translation and are reset at their next packet.
        Raises EdgeUnavailable when the firewall cannot be read."""
        main, masq = chains(self.short, cluster_id)
        edge_chain, masq_chain = installation_chains(self.short)
        with self._lock:
            for table, parent, chain in (
                ("nat", edge_chain, main),
                ("nat", masq_chain, masq),
                ("filter", edge_chain, main),
            ):
                while self._ipt("-t", table, "-D", parent, "-j", chain).returncode == 0:
                    pass
                if self._ipt("-t", table, "-S", chain).returncode == 0:
                    self._ipt("-t", table, "-F", chain)
                    self._must(
                        self._ipt("-t", table, "-X", chain),
                        f"deleting the rules of training cluster {cluster_id}",
                    )

    def clusters(self) -> set[int]:
        """The ids of the clusters with rules here (the nat chain's jumps)."""
        edge_chain, _ = installation_chains(self.short)
        listed = self._ipt("-t", "nat", "-S", edge_chain)
        if listed.returncode != 0:
            return set()
        return {
            int(m.group(1))
            for line in listed.output.splitlines()
            if (m := _CLUSTER_CHAIN.match(line.strip()))
        }

    def uninstall(self) -> None:
        """Every rule and chain of this installation's edge, gone (tests, uninstall)."""
        for cluster_id in self.clusters():
            self.remove(cluster_id)
        edge_chain, masq_chain = installation_chains(self.short)
        with self._lock:
            for table, builtin, chain in _jumps(edge_chain, masq_chain):
                while self._ipt("-t", table, "-D", builtin, "-j", chain).returncode == 0:
                    pass
            for table, chain in (("nat", edge_chain), ("nat", masq_chain), ("filter", edge_chain)):
                self._ipt("-t", table, "-F", chain)
                self._ipt("-t", table, "-X", chain)

    def _ensure_jumps(self, cluster_id: int) -> None:
        main, masq = chains(self.short, cluster_id)
        edge_chain, masq_chain = installation_chains(self.short)
        for table, chain in (("nat", edge_chain), ("nat", masq_chain), ("filter", edge_chain)):
            if self._ipt("-t", table, "-S", chain).returncode != 0:
                created = self._ipt("-t", table, "-N", chain)
                if created.returncode != 0 and self._ipt("-t", table, "-S", chain).returncode:
                    self._must(created, f"creating {table} {chain}")
        for table, builtin, chain in _jumps(edge_chain, masq_chain):
            self._keep_first(table, builtin, chain)
        for table, parent, child in (
            ("nat", edge_chain, main),
            ("nat", masq_chain, masq),
            ("filter", edge_chain, main),
        ):
            if self._ipt("-t", table, "-C", parent, "-j", child).returncode != 0:
                self._must(self._ipt("-t", table, "-A", parent, "-j", child), f"jumping to {child}")

    def _keep_first(self, table: str, builtin: str, chain: str) -> None:
        """Our jump comes before every rule of ``builtin`` but other gpuyard jumps (the
        engine inserts its own at the top when they are missing, and above ours they
        could accept a denied flow; the isolation chain, runtimes/host_firewall.py, keeps
        itself first, and both only drop or refuse, so their order does not matter)."""
        listed = self._ipt("-t", table, "-S", builtin)
        self._must(listed, f"reading {table} {builtin}")
        rules = [line for line in listed.output.splitlines() if line.startswith("-A ")]
        ours = f"-A {builtin} -j {chain}"
        lead = 0
        while lead < len(rules) and rules[lead].startswith(f"-A {builtin} -j GY-"):
            if rules[lead] == ours:
                return
            lead += 1
        while self._ipt("-t", table, "-D", builtin, "-j", chain).returncode == 0:
            pass  # ours further down: it goes up, after the leading gpuyard jumps
        self._must(
            self._ipt("-t", table, "-I", builtin, str(lead + 1), "-j", chain),
            f"jumping from {builtin}",
        )

    @staticmethod
    def _must(result: CommandResult, doing: str) -> None:
        if result.returncode != 0:
            raise EdgeUnavailable(f"{doing}: {result.output.strip() or 'iptables failed'}")


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
