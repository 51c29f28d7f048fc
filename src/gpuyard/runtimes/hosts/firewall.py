"""The host firewall rules that keep account networks apart.

Every engine network gpuyard makes (one per account, one per training cluster) gets a
bridge interface named by :func:`bridge_name`. This module keeps, in the host's
``FORWARD`` chain, a jump to one chain of this installation that drops every *new*
connection into one of our bridges from anywhere but that bridge itself — unless the
engine's port publishing rewrote it (conntrack state ``DNAT``): a published host port
stays reachable, as it is from the outside world. Answers to a cluster's own outgoing
connections are ``ESTABLISHED`` and pass, so a cluster reaches the internet (NAT), the
host, and its own account's clusters, never another account's or a training
cluster's network.

Why our own rules: Docker isolates its bridge networks from each other, but Podman's
netavark (1.4, measured) keeps one shared jump for all its ``isolate`` networks and
deletes it whenever any one of them loses its last container — one tenant stopping
their last cluster would open every other account's network until the next container
starts. The rules here are ours alone (one chain per installation), are checked before
each container joins a network, and again every pass of the reconciler's scan, so a
firewall reload is repaired within the scan interval.

Commands run through an injected runner, so the rule logic is tested without a host
firewall; :class:`IptablesIsolation` is the real one (``iptables -w``; root needed).
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

# Linux interface names hold at most 15 characters.
_IFNAME_MAX = 15

_OUT_BRIDGE = re.compile(r" -o (\S+) ")
# A plain jump to an isolation chain (chain_name) of any installation.
_ISOLATION_JUMP = re.compile(r"-A FORWARD -j GY-ISO-[\w-]+")

Runner = Callable[[Sequence[str]], "CommandResult"]


@dataclass(frozen=True)
class CommandResult:
    returncode: int
    output: str


def bridge_name(network: str) -> str:
    """The bridge interface of our network ``network``: ``gy`` and 12 hex digits of its
    name's hash (unique per name; within Linux's 15-character limit)."""
    name = "gy" + hashlib.sha256(network.encode()).hexdigest()[:12]
    assert len(name) <= _IFNAME_MAX
    return name


def chain_name(installation_prefix: str) -> str:
    """This installation's chain: two installations on one host keep separate rules."""
    return f"GY-ISO-{installation_prefix}"[:28]


def drop_rule(bridge: str) -> list[str]:
    """The rule (after ``-A CHAIN``) that closes ``bridge`` to new connections from
    other interfaces, except published ports."""
    # Anything but an answer (ESTABLISHED, RELATED) or a published port (DNAT): new
    # connections, and INVALID packets too (an ACK scan).
    return [
        "-o", bridge, "!", "-i", bridge,
        "-m", "conntrack", "!", "--ctstate", "RELATED,ESTABLISHED,DNAT",
        "-m", "comment", "--comment", "gpuyard network isolation",
        "-j", "DROP",
    ]  # fmt: skip


# Packets that enter a bridge of ours addressed to the host's loopback are dropped
# before the engine's port publishing (nat PREROUTING) sees them. A private port is
# published on 127.0.0.1 only, and Podman turns on route_localnet on the bridge of a
# network with such a port, so without this a container forging packets to 127.0.0.1
# (raw sockets: CAP_NET_RAW is a default capability) through its gateway would be
# rewritten to another account's private port. Nothing legitimate enters a bridge for
# 127.0.0.0/8. One rule for every gpuyard bridge (``gy`` + hash) of every installation:
# the same text, so installations share it; it is left in place on removal.
LOOPBACK_GUARD = [
    "-i", "gy+", "-d", "127.0.0.0/8",
    "-m", "comment", "--comment", "gpuyard: no host loopback from bridges",
    "-j", "DROP",
]  # fmt: skip


def jump_comes_first(forward_rules: Sequence[str], chain: str) -> bool:
    """Whether ``FORWARD`` (its ``-A FORWARD`` lines, in order) jumps to ``chain``
    before any rule that could accept a packet. Only jumps to other installations'
    isolation chains may come before it: those chains hold nothing but drop rules
    (:func:`drop_rule`), so whatever they let through still reaches ours. Asking for
    the very first place instead would make installations sharing a host take it from
    each other at every container start (five commands each time, not one)."""
    ours = f"-A FORWARD -j {chain}"
    for line in forward_rules:
        if line == ours:
            return True
        if not _ISOLATION_JUMP.fullmatch(line):
            return False
    return False


def subprocess_runner(argv: Sequence[str]) -> CommandResult:
    """Run ``argv``; its exit status and output (stdout and stderr together)."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return CommandResult(127, str(exc))
    return CommandResult(done.returncode, (done.stdout + done.stderr).strip())


class IsolationUnavailable(Exception):
    """The host firewall cannot be changed from here (no iptables, not root)."""


class IptablesIsolation:
    """Our isolation chain on the local host, kept with ``iptables``.

    ``protect(bridges)`` is idempotent and thread-safe: the chain exists, ``FORWARD``
    jumps to it first, each bridge has its drop rule, and the raw table's
    :data:`LOOPBACK_GUARD` is in place. Raises
    :class:`IsolationUnavailable` when the firewall cannot be changed."""

    def __init__(
        self,
        installation_prefix: str,
        *,
        runner: Runner = subprocess_runner,
        iptables: str | None = None,
    ) -> None:
        self.chain = chain_name(installation_prefix)
        self._run = runner
        self._iptables = iptables or shutil.which("iptables") or "iptables"
        self._lock = threading.Lock()

    def _ipt(self, *args: str) -> CommandResult:
        # -w 5: wait a little for the xtables lock while the engine changes rules, never
        # for ever (the caller retries on its next pass).
        return self._run([self._iptables, "-w", "5", *args])

    def available(self) -> str | None:
        """None when rules can be read and written here, else why not."""
        probe = self._ipt("-S", "FORWARD")
        if probe.returncode != 0:
            return f"the host firewall cannot be managed ({probe.output or 'iptables failed'})"
        return None

    def protect(self, bridges: Iterable[str]) -> None:
        """Close ``bridges`` (the rules of those already closed are left as they are).

        Rules are never deleted here, not even a removed network's: deciding that a
        bridge is gone races with a network being made under the same name (one
        process listing, another creating), and a wrongly deleted rule would open a
        live network until the next pass. A bridge's name is fixed by its network's
        name, so a network made again reuses its rule; the chain grows by one rule per
        network ever made (accounts, training clusters), which costs nothing to keep."""
        with self._lock:
            self._ensure_chain()
            self._ensure_loopback_guard()
            present = self._closed_bridges()
            for bridge in sorted(set(bridges) - present):
                rule = drop_rule(bridge)
                self._must(self._ipt("-A", self.chain, *rule), f"closing bridge {bridge}")

    def keep_first(self) -> None:
        """Our jump comes before every rule of ``FORWARD`` that could accept (only other
        installations' isolation jumps may precede it, :func:`jump_comes_first`): the
        engine inserts its own jumps (which accept its networks' traffic) at the top
        when they are missing, e.g. at the first container start after a reboot, and
        above ours they would win. One ``iptables -S FORWARD`` when nothing moved."""
        with self._lock:
            self._ensure_chain()

    def _closed_bridges(self) -> set[str]:
        return {m.group(1) for line in self.rules() if (m := _OUT_BRIDGE.search(line))}

    def _ensure_chain(self) -> None:
        listed = self._ipt("-S", "FORWARD")
        self._must(listed, "reading FORWARD")
        rules = [line for line in listed.output.splitlines() if line.startswith("-A FORWARD")]
        if jump_comes_first(rules, self.chain):
            # The usual case, one command (this runs after every container start): a
            # jump to it means the chain exists.
            return
        if self._ipt("-S", self.chain).returncode != 0:
            created = self._ipt("-N", self.chain)
            # A concurrent process may have made it meanwhile.
            if created.returncode != 0 and self._ipt("-S", self.chain).returncode != 0:
                self._must(created, "creating the isolation chain")
        while self._ipt("-D", "FORWARD", "-j", self.chain).returncode == 0:
            pass
        self._must(self._ipt("-I", "FORWARD", "1", "-j", self.chain), "jumping to it first")

    def _ensure_loopback_guard(self) -> None:
        if self._ipt("-t", "raw", "-C", "PREROUTING", *LOOPBACK_GUARD).returncode == 0:
            return
        self._must(
            self._ipt("-t", "raw", "-I", "PREROUTING", "1", *LOOPBACK_GUARD),
            "dropping packets for the host's loopback from our bridges",
        )

    def rules(self) -> list[str]:
        """The chain's rules as ``iptables -S`` prints them (empty if it is missing)."""
        listed = self._ipt("-S", self.chain)
        if listed.returncode != 0:
            return []
        return [line for line in listed.output.splitlines() if line.startswith("-A ")]

    def remove(self) -> None:
        """Delete the chain and its jump (tests and uninstall). Idempotent."""
        with self._lock:
            while self._ipt("-D", "FORWARD", "-j", self.chain).returncode == 0:
                pass
            self._ipt("-F", self.chain)
            self._ipt("-X", self.chain)

    @staticmethod
    def _must(result: CommandResult, doing: str) -> None:
        if result.returncode != 0:
            raise IsolationUnavailable(f"{doing}: {result.output or 'iptables failed'}")
