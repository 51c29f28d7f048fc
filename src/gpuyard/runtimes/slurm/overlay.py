"""The overlay that joins the copies of one training cluster's network on several hosts.

Each host has its own bridge for the cluster's network (the engine makes it; same
subnet everywhere, runtimes/engines/engine.py). On every host the cluster uses, a VXLAN
interface with the cluster's own VNI is made a port of that bridge, and floods to the
other hosts' addresses (head-end replication, one all-zero FDB entry per peer; unicast
destinations are learned). So every node reaches every other node at layer 2, on every
TCP and UDP port, host to host over UDP, never through the control plane.

What keeps it private:
- A VXLAN frame is only ever delivered into the bridge of the VNI it carries; another
  cluster's nodes are on other bridges (and the host isolation chain,
  runtimes/hosts/firewall.py, keeps routed traffic between bridges out).
- Containers cannot speak VXLAN to any host: UDP to the overlay port coming *from* a
  container bridge (``gy+``) is dropped on input and when routed out of the bridge, on
  every host, so no
  tenant forges frames into another's VNI. The rules are the same for every
  installation and are never removed (a neighbour's overlay relies on them too).
- Every host has its own gateway address on the network (the subnet's first address,
  core/training/network.py). A bridge-family nftables table per cluster keeps ARP for
  that address from crossing the overlay, so each node's gateway is its own host's.

Everything is done by one idempotent shell script per host, run through the host's
command runner (local, or over the same SSH connection as its engine), so a scan that
repeats it heals a host whose bridge was recreated (netavark removes a bridge with its
last container and makes a new one with the next).
"""

from __future__ import annotations

import hashlib
import ipaddress
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from gpuyard.core.errors import RuntimeFailure
from gpuyard.runtimes.hosts.firewall import Runner, bridge_name

# The IANA VXLAN port (Linux's default is the older 8472).
DEFAULT_PORT = 4789
# VXLAN over IPv4 adds 50 bytes; the cluster network's MTU leaves room for them on a
# 1500-byte host network.
OVERLAY_MTU = 1450


def vxlan_name(network: str) -> str:
    """The VXLAN interface of ``network``: ``gv`` and 12 hex digits (15 at most)."""
    return "gv" + hashlib.sha256(network.encode()).hexdigest()[:12]


def vni(network: str) -> int:
    """The cluster network's VXLAN id (24 bits, never 0). Derived from the network's
    name, which holds the installation's id, so two installations differ."""
    return int(hashlib.sha256(network.encode()).hexdigest()[:6], 16) % 0xFFFFFE + 1


@dataclass(frozen=True)
class OverlaySpec:
    """One host's part of a cluster's overlay."""

    network: str  # the engine network's name
    local: str  # this host's address, as its peers reach it
    peers: tuple[str, ...]  # the other hosts of the cluster
    gateway: str  # the per-host gateway address kept off the overlay
    port: int = DEFAULT_PORT


def _table(network: str) -> str:
    return "gyovl_" + hashlib.sha256(network.encode()).hexdigest()[:12]


def attach_script(spec: OverlaySpec) -> str:
    """A POSIX shell script that makes ``spec`` true on the host and exits 0; idempotent.
    Before the bridge exists (no node of the cluster on the host yet) it makes the VXLAN
    interface and its FDB and leaves it unattached."""
    for address in (spec.local, *spec.peers, spec.gateway):
        ipaddress.ip_address(address)  # only addresses reach the shell
    vx, br, table = vxlan_name(spec.network), bridge_name(spec.network), _table(spec.network)
    peers = " ".join(spec.peers)
    gw = spec.gateway
    guard = (
        f"table bridge {table}\n"
        f"delete table bridge {table}\n"
        f"table bridge {table} {{\n"
        f"  chain gy_fwd {{ type filter hook forward priority 0; policy accept;\n"
        f'    oifname "{vx}" arp daddr ip {gw} drop\n'
        f'    iifname "{vx}" arp saddr ip {gw} drop\n'
        f"  }}\n"
        f"  chain gy_out {{ type filter hook output priority 0; policy accept;\n"
        f'    oifname "{vx}" arp saddr ip {gw} drop\n'
        f"  }}\n"
        f"  chain gy_in {{ type filter hook input priority 0; policy accept;\n"
        f'    iifname "{vx}" arp saddr ip {gw} drop\n'
        f"  }}\n"
        f"}}\n"
    )
    return f"""set -e
vx={vx}; br={br}; port={spec.port}
iptables -w -C INPUT -i gy+ -p udp --dport $port -j DROP 2>/dev/null ||
  iptables -w -I INPUT -i gy+ -p udp --dport $port -j DROP
iptables -w -C FORWARD -i gy+ ! -o gy+ -p udp --dport $port -j DROP 2>/dev/null ||
  iptables -w -I FORWARD -i gy+ ! -o gy+ -p udp --dport $port -j DROP
if ! ip link show $vx >/dev/null 2>&1; then
  ip link add $vx type vxlan id {vni(spec.network)} dstport $port local {spec.local} ttl 64
fi
ip link set $vx mtu {OVERLAY_MTU}
want="{peers}"
have=$(bridge fdb show dev $vx | awk '$1=="00:00:00:00:00:00" {{print $3}}')
for p in $have; do
  case " $want " in *" $p "*) ;; *) bridge fdb del 00:00:00:00:00:00 dev $vx dst $p ;; esac
done
for p in $want; do
  case " $have " in *" $p "*) ;; *) bridge fdb append 00:00:00:00:00:00 dev $vx dst $p ;; esac
done
printf %s {shlex.quote(guard)} | nft -f -
if ip link show $br >/dev/null 2>&1; then
  ip link set $vx master $br
  ip link set $vx up
fi
"""


def detach_script(network: str) -> str:
    """A script that removes the cluster's overlay from the host; idempotent."""
    return (
        f"ip link del {vxlan_name(network)} 2>/dev/null || true\n"
        f"nft delete table bridge {_table(network)} 2>/dev/null || true\n"
    )


def run_script(runner: Runner, script: str, doing: str) -> None:
    """Run ``script`` with ``sh -c`` through ``runner``; raises RuntimeFailure saying
    ``doing`` and the script's output when it fails."""
    argv: Sequence[str] = ("sh", "-c", script)
    result = runner(argv)
    if result.returncode != 0:
        raise RuntimeFailure(
            f"{doing} failed: {result.output.strip()[-400:]}", {"exit_code": result.returncode}
        )
