"""A training cluster's own network: subnets and fixed addresses (pure), and the overlay
script run for real between two network namespaces this test makes, each with the
cluster's bridge and one "node" behind it, as two hosts with a node each would be."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator

import pytest

from gpuyard.core.training import network as tn
from gpuyard.runtimes.hosts.firewall import bridge_name
from gpuyard.runtimes.slurm.overlay import (
    OverlaySpec,
    attach_script,
    detach_script,
    vni,
    vxlan_name,
)
from tests.required_parts import as_root, first_problem, needs, on_path


def test_subnets_come_from_the_pool_never_overlapping_those_in_use() -> None:
    pool = "10.213.0.0/22"  # four /24s
    used = ["10.213.0.0/24", "10.213.2.0/24"]
    picked = tn.pick_subnet(pool, used, choose=lambda free: free[0])
    assert picked == "10.213.1.0/24"
    assert tn.pick_subnet(pool, [*used, "10.213.1.0/24", "10.213.3.0/24"]) is None
    assert tn.pick_subnet("10.9.0.0/24", ["10.9.0.0/16"]) is None  # a wider one in use


def test_default_pools_differ_by_installation_and_pools_are_checked() -> None:
    pools = {tn.default_pool(str(uuid.uuid4())) for _ in range(20)}
    assert len(pools) > 1 and all(p.startswith("10.") and p.endswith(".0.0/16") for p in pools)
    assert tn.check_pool("10.1.2.3/16") == "10.1.0.0/16"
    for bad in ("10.0.0.0/25", "fd00::/64", "nonsense"):
        with pytest.raises(ValueError):
            tn.check_pool(bad)


def test_node_addresses_are_fixed_and_distinct() -> None:
    subnet = "10.213.7.0/24"
    assert tn.gateway(subnet) == "10.213.7.1"
    assert tn.controller_address(subnet) == "10.213.7.254"
    assert tn.worker_address(subnet, []) == "10.213.7.10"
    assert tn.worker_address(subnet, ["10.213.7.10", "10.213.7.12"]) == "10.213.7.11"
    every = [f"10.213.7.{i}" for i in range(10, 254)]
    assert tn.worker_address(subnet, every) is None


def test_interface_names_and_vnis_fit_and_differ_by_network() -> None:
    assert len(vxlan_name("gyabc-tc1-net")) <= 15
    assert vxlan_name("a-tc1-net") != vxlan_name("b-tc1-net")
    assert 0 < vni("a-tc1-net") < 2**24 and vni("a-tc1-net") != vni("b-tc1-net")


def test_the_script_takes_only_addresses() -> None:
    with pytest.raises(ValueError):
        attach_script(OverlaySpec("n", "10.0.0.1; reboot", (), "10.1.0.1"))


# -- the overlay on real interfaces ----------------------------------------------------

real = needs(
    "root, ip, nft, iptables and bridge",
    first_problem(as_root(), on_path("ip", "nft", "iptables", "bridge")),
    how="run the tests as root; apt-get install iproute2 nftables iptables",
)


def _sh(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=30)


def _in(ns: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return _sh("ip", "netns", "exec", ns, *argv)


_CONNECT = """
import socket, sys
s = socket.socket(); s.settimeout(2)
try:
    s.connect((sys.argv[1], 7000)); print("open")
except ConnectionRefusedError:
    print("refused")
except OSError:
    print("unreachable")
"""


_ARP_WHO_HAS = """
import socket, struct, sys, time
gateway, mine = socket.inet_aton(sys.argv[1]), socket.inet_aton(sys.argv[2])
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0806))
s.bind(("c", 0))
mac = s.getsockname()[4]
arp = struct.pack("!HHBBH", 1, 0x0800, 6, 4, 1) + mac + mine + bytes(6) + gateway
s.send(b"\\xff" * 6 + mac + b"\\x08\\x06" + arp)
s.settimeout(0.2)
answers, end = set(), time.time() + 1.5
while time.time() < end:
    try:
        frame = s.recv(128)
    except TimeoutError:
        continue
    if frame[12:14] == b"\\x08\\x06" and frame[20:22] == b"\\x00\\x02" and frame[28:32] == gateway:
        answers.add(frame[22:28].hex())
print(len(answers))
"""


def _gateway_answers(host: Host) -> int:
    """How many machines answer an ARP who-has for the gateway from ``host``'s node."""
    done = _in(
        host.node, sys.executable, "-c", _ARP_WHO_HAS, tn.gateway(host.subnet), host.node_address
    )
    assert done.returncode == 0, done.stderr
    return int(done.stdout.strip())


def _eventually(check: Callable[[], bool], timeout_s: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def _connect(ns: str, address: str) -> str:
    """From namespace ``ns``, a TCP connect to ``address``:7000: ``open``, ``refused``
    (the address answered) or ``unreachable``."""
    return _in(ns, sys.executable, "-c", _CONNECT, address).stdout.strip()


class Host:
    """A network namespace with an uplink to the other "host", the cluster's bridge
    (its gateway on it) and one node namespace on the bridge."""

    def __init__(self, tag: str, index: int, network: str, subnet: str) -> None:
        self.ns, self.node = f"gyot{tag}h{index}", f"gyot{tag}n{index}"
        self.address = f"10.77.0.{index}"
        self.node_address = f"{subnet.rsplit('.', 1)[0]}.{10 + index}"
        self.network, self.subnet = network, subnet

    def make(self) -> None:
        for ns in (self.ns, self.node):
            assert _sh("ip", "netns", "add", ns).returncode == 0
        br, gw = bridge_name(self.network), tn.gateway(self.subnet)
        steps = [
            f"ip link set lo up && ip link add {br} type bridge && ip addr add {gw}/24 dev {br}",
            f"ip link set {br} up && ip link add v type veth peer name c",
            f"ip link set v master {br} && ip link set v up && ip link set c netns {self.node}",
        ]
        for step in steps:
            done = _in(self.ns, "sh", "-c", step)
            assert done.returncode == 0, done.stderr
        done = _in(
            self.node,
            "sh",
            "-c",
            f"ip link set lo up && ip addr add {self.node_address}/24 dev c && ip link set c up"
            f" && ip route add default via {gw}",
        )
        assert done.returncode == 0, done.stderr

    def attach(self, peers: tuple[str, ...]) -> None:
        spec = OverlaySpec(self.network, self.address, peers, tn.gateway(self.subnet))
        done = _in(self.ns, "sh", "-c", attach_script(spec))
        assert done.returncode == 0, done.stdout + done.stderr

    def close(self) -> None:
        for ns in (self.node, self.ns):
            _sh("ip", "netns", "del", ns)


@pytest.fixture
def two_hosts() -> Iterator[tuple[Host, Host]]:
    tag = uuid.uuid4().hex[:4]
    network, subnet = f"gy{tag}-tc1-net", "10.213.200.0/24"
    a, b = Host(tag, 1, network, subnet), Host(tag, 2, network, subnet)
    try:
        a.make()
        b.make()
        # The two hosts' uplinks: one veth pair between their namespaces.
        assert (
            _in(a.ns, "ip", "link", "add", "up0", "type", "veth", "peer", "name", "up1").returncode
            == 0
        )
        assert _in(a.ns, "ip", "link", "set", "up1", "netns", b.ns).returncode == 0
        for host, dev in ((a, "up0"), (b, "up1")):
            done = _in(
                host.ns,
                "sh",
                "-c",
                f"ip addr add {host.address}/24 dev {dev} && ip link set {dev} up",
            )
            assert done.returncode == 0, done.stderr
        yield a, b
    finally:
        a.close()
        b.close()


@real
def test_nodes_on_two_hosts_reach_each_other_and_each_keeps_its_own_gateway(
    two_hosts: tuple[Host, Host],
) -> None:
    a, b = two_hosts
    assert _connect(a.node, b.node_address) == "unreachable"  # no overlay yet
    a.attach((b.address,))
    b.attach((a.address,))
    a.attach((b.address,))  # idempotent: again changes nothing
    # The failed try above left a FAILED neighbour entry, probed again after a while.
    assert _eventually(lambda: _connect(a.node, b.node_address) == "refused")  # b answered
    assert _connect(b.node, a.node_address) == "refused"
    # Each node's gateway answers from its own host's bridge, never across.
    gw = tn.gateway(a.subnet)
    for host in (a, b):
        assert _connect(host.node, gw) == "refused"
        bridge_mac = _in(host.ns, "cat", f"/sys/class/net/{bridge_name(host.network)}/address")
        neighbour = _in(host.node, "ip", "neigh", "show", gw).stdout
        assert bridge_mac.stdout.strip() in neighbour, (neighbour, bridge_mac.stdout)
    # Only the node's own host answers for the gateway: the other host's bridge, which
    # holds the same address, is never asked across the overlay.
    assert _gateway_answers(a) == 1 and _gateway_answers(b) == 1
    # One flood entry per peer, whatever the repeats.
    fdb = _in(a.ns, "bridge", "fdb", "show", "dev", vxlan_name(a.network)).stdout
    assert fdb.count("00:00:00:00:00:00") == 1

    # A peer that left is dropped from the flood list; detach removes everything.
    a.attach(())
    fdb = _in(a.ns, "bridge", "fdb", "show", "dev", vxlan_name(a.network)).stdout
    assert "00:00:00:00:00:00" not in fdb
    assert _in(a.ns, "sh", "-c", detach_script(a.network)).returncode == 0
    assert _in(a.ns, "ip", "link", "show", vxlan_name(a.network)).returncode != 0
    assert "gyovl_" not in _in(a.ns, "nft", "list", "tables").stdout
