"""A start that keeps every port its cluster holds leaves the port rows as they are
(services/capacity/placement.py ``ports_kept``); anything that would change them (a
port added or gone, another host, a port the user chose, a port listed twice) takes
the full assignment."""

from __future__ import annotations

from gpuyard.core.models import PortSpec
from gpuyard.services.capacity.placement import ports_kept
from gpuyard.store.schema import PortAllocation

HTTP = PortSpec(internal_port=8888, protocol="http")
SSH = PortSpec(internal_port=22, protocol="tcp")


def row(port: int, spec: PortSpec, host_id: int = 1) -> PortAllocation:
    return PortAllocation(
        host_id=host_id,
        port=port,
        protocol=spec.transport,
        cluster_id="c1",
        internal_port=spec.internal_port,
    )


def test_every_port_kept_answers_the_held_ports_in_the_specs_order() -> None:
    rows = [row(30002, SSH), row(30001, HTTP)]
    assert ports_kept(rows, (HTTP, SSH), host_id=1) == {
        (8888, HTTP.transport): 30001,
        (22, SSH.transport): 30002,
    }
    assert list(ports_kept(rows, (HTTP, SSH), host_id=1) or {}) == [
        (8888, HTTP.transport),
        (22, SSH.transport),
    ]


def test_anything_that_would_change_takes_the_full_assignment() -> None:
    rows = [row(30001, HTTP), row(30002, SSH)]
    chosen = PortSpec(internal_port=22, protocol="tcp", external_port=30002)
    assert ports_kept(rows, (HTTP, SSH), host_id=2) is None  # another host
    assert ports_kept(rows, (HTTP,), host_id=1) is None  # a port gone
    assert ports_kept(rows[:1], (HTTP, SSH), host_id=1) is None  # a port added
    assert ports_kept(rows, (HTTP, chosen), host_id=1) is None  # the user's choice
    assert ports_kept(rows, (HTTP, SSH, SSH), host_id=1) is None  # listed twice
    assert ports_kept([*rows, row(30003, SSH)], (HTTP, SSH), host_id=1) is None
    assert ports_kept([], (), host_id=1) == {}
