"""What the host says holds a port (runtimes/hosts/ports.py): ``ss`` listings and the
engine's list of containers, read into (port, transport) pairs."""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import cast

from gpuyard.runtimes.engines.engine import Engine
from gpuyard.runtimes.hosts.firewall import CommandResult
from gpuyard.runtimes.hosts.ports import listening_ports, ports_in_use, published_ports

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
    containers: list[dict[str, object]] = [
        {"Names": ["/other-install-abc"], "Ports": [{"PublicPort": 20000, "Type": "tcp"}]},
        {"Names": ["/mine"], "Ports": [{"PublicPort": 20001, "Type": "tcp"}]},
        {"Names": ["/udp"], "Ports": [{"PublicPort": 20002, "Type": "udp"}, {"PrivatePort": 80}]},
        {"Names": ["/no-ports"], "Ports": None},
    ]
    assert published_ports(containers, "mine") == {(20000, "tcp"), (20002, "udp")}


SS_BOTH = """\
tcp   LISTEN 0      4096         0.0.0.0:20000      0.0.0.0:*
udp   UNCONN 0      0        127.0.0.1%lo:20001     0.0.0.0:*
tcp   LISTEN 0      128             [::]:22            [::]:*
LISTEN 0 1 0.0.0.0:20009 0.0.0.0:*
garbage
"""


def test_listening_ports_of_one_listing_for_both_transports() -> None:
    # One ss for both (-t -u): each line's first column names its transport.
    assert listening_ports(SS_BOTH) == {(20000, "tcp"), (20001, "udp"), (22, "tcp")}


class _Api:
    def containers(self, all: bool = False) -> list[dict[str, object]]:
        return [{"Names": ["/x"], "Ports": [{"PublicPort": 20003, "Type": "tcp"}]}]


class _Engine:
    """What ports_in_use reads of an engine: its API and how commands reach its host."""

    base_url = "ssh://host"

    def __init__(self) -> None:
        self.api = _Api()
        self.commands: list[list[str]] = []

    def host_runner(self, argv: Sequence[str]) -> CommandResult:
        self.commands.append(list(argv))
        return CommandResult(0, SS_BOTH)


def test_ports_in_use_asks_the_host_once_for_both_transports() -> None:
    engine = _Engine()
    fake = cast(Engine, SimpleNamespace(api=engine.api, base_url=engine.base_url,
                                        host_runner=engine.host_runner))  # fmt: skip
    found = ports_in_use(fake, 20000, 20010, "mine")
    assert found == {(20000, "tcp"), (20001, "udp"), (20003, "tcp")}
    assert engine.commands == [["ss", "-H", "-l", "-n", "-t", "-u"]]
