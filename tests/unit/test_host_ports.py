"""What the host says holds a port (runtimes/hosts/ports.py): ``ss`` listings and the
engine's list of containers, read into (port, transport) pairs."""

from __future__ import annotations

from gpuyard.runtimes.hosts.ports import listening_ports, published_ports

SS_TCP = """\
LISTEN 0      4096         0.0.0.0:20000      0.0.0.0:*
LISTEN 0      128             [::]:22            [::]:*
LISTEN 0      4096       127.0.0.1%lo:20005   0.0.0.0:*
LISTEN 0      511                *:8443             *:*
garbage
"""


def test_listening_ports_of_every_address_form() -> None:
    assert listening_ports(SS_TCP, "tcp") == {
        (20000, "tcp"),
        (22, "tcp"),
        (20005, "tcp"),
        (8443, "tcp"),
    }
    assert listening_ports("UNCONN 0 0 0.0.0.0:20001 0.0.0.0:*", "udp") == {(20001, "udp")}


def test_published_ports_skip_the_cluster_being_started() -> None:
    containers = [
        {"Names": ["/other-install-abc"], "Ports": [{"PublicPort": 20000, "Type": "tcp"}]},
        {"Names": ["/mine"], "Ports": [{"PublicPort": 20001, "Type": "tcp"}]},
        {"Names": ["/udp"], "Ports": [{"PublicPort": 20002, "Type": "udp"}, {"PrivatePort": 80}]},
        {"Names": ["/no-ports"], "Ports": None},
    ]
    assert published_ports(containers, "mine") == {(20000, "tcp"), (20002, "udp")}
