"""The node runtime of each host of a fleet (runtimes/slurm/host_nodes.py) and a node runtime
made on a host's engine (runtimes/slurm/nodes.py): no engine is contacted."""

from __future__ import annotations

import pytest

from gpuyard.core.errors import RuntimeFailure
from gpuyard.core.ownership import Ownership
from gpuyard.runtimes.base import Runtime
from gpuyard.runtimes.engines.engine import Engine, EnginePolicy
from gpuyard.runtimes.fleet import Fleet, HostEngine
from gpuyard.runtimes.slurm.host_nodes import HostNodes
from gpuyard.runtimes.slurm.nodes import SlurmNodeRuntime
from gpuyard.testing.fake_nodes import FakeNodeRuntime
from gpuyard.testing.fake_runtime import FakeRuntime

LOCAL, REMOTE = 1, 2


class Hosts:
    def __init__(self) -> None:
        self.url = "ssh://root@h2.example"

    def __call__(self, host_id: int) -> HostEngine | None:
        if host_id == LOCAL:
            return HostEngine(LOCAL, "here", None, is_local=True)
        if host_id == REMOTE:
            return HostEngine(REMOTE, "h2", self.url)
        return None


def fleet_and_nodes() -> tuple[Fleet, Hosts, HostNodes[FakeNodeRuntime], list[Runtime]]:
    hosts = Hosts()
    fleet = Fleet(FakeRuntime(), lambda host: FakeRuntime(), hosts)
    made_from: list[Runtime] = []

    def make(runtime: Runtime) -> FakeNodeRuntime:
        made_from.append(runtime)
        return FakeNodeRuntime()

    return fleet, hosts, HostNodes(fleet, FakeNodeRuntime(), make), made_from


def test_this_machines_host_and_no_host_use_the_local_node_runtime() -> None:
    _, _, nodes, made_from = fleet_and_nodes()
    assert nodes.on_host(LOCAL) is nodes.local
    assert nodes.on_host(None) is nodes.local
    assert made_from == []


def test_a_remote_host_gets_a_node_runtime_from_its_runtime_once() -> None:
    fleet, hosts, nodes, made_from = fleet_and_nodes()
    owner = Ownership.new()
    nodes.bind(owner)
    first = nodes.on_host(REMOTE)
    assert first is not nodes.local and nodes.on_host(REMOTE) is first
    assert made_from == [fleet.for_host(REMOTE)]
    assert first.owner == owner and nodes.local.owner == owner
    # The host's engine URL changed: the fleet made a new runtime, so a new node runtime.
    hosts.url = "tcp://h2.example:2376"
    second = nodes.on_host(REMOTE)
    assert second is not first and made_from[-1] is fleet.for_host(REMOTE)


def test_an_unknown_host_is_an_error_not_this_machine() -> None:
    _, _, nodes, _ = fleet_and_nodes()
    with pytest.raises(RuntimeFailure):
        nodes.on_host(99)


def test_without_a_factory_every_host_is_this_machines() -> None:
    nodes = HostNodes(Fleet(FakeRuntime()), FakeNodeRuntime(), lambda _rt: FakeNodeRuntime())
    assert nodes.on_host(REMOTE) is nodes.local


def test_a_node_runtime_on_a_hosts_engine_keeps_it_but_waits_longer() -> None:
    owner = Ownership.new()
    policy = EnginePolicy(allow_unenforced_limits=True, allow_unisolated_networks=True)
    host = Engine("unix:///run/gpuyard-test/none.sock", 30, owner, policy=policy)
    host.tls = object()
    source = Engine("unix:///run/gpuyard-test/here.sock", 60)
    nodes = SlurmNodeRuntime(None, engine=host, image_source=source)
    # exec needs its command's timeout below the request timeout: 30 s would refuse
    # the default 30 s exec, so the host's engine is reached with the node runtime's.
    assert nodes.timeout_s == 60 and nodes.engine.timeout_s == 60
    assert nodes.engine.base_url == host.base_url and nodes.engine.tls is host.tls
    assert nodes.engine.owner == owner and nodes.engine.allow_unenforced_limits
    assert nodes.engine.allow_unisolated_networks and nodes.image_source is source
    longer = Engine("unix:///run/gpuyard-test/none.sock", 120, owner)
    assert SlurmNodeRuntime(None, engine=longer).engine is longer
