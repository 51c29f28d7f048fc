"""Training clusters bigger than one host: placed across the hosts of their location,
all or nothing, each node created through the runtime of the host it claimed capacity
on, the cluster's network made on every host it uses with one subnet and joined by the
overlay, and every node knowing every other node's address. Real database (SQLite and
PostgreSQL), in-memory engines and node runtimes per host."""

from __future__ import annotations

import dataclasses

import pytest
from sqlalchemy import func, select

from gpuyard.core.errors import InsufficientCapacity
from gpuyard.core.fleet import PlacementPolicy
from gpuyard.core.training.clusters import NodeName
from gpuyard.reconciler.training.operator import TrainingOperator
from gpuyard.reconciler.wiring import build_reconciler
from gpuyard.runtimes.base import Runtime
from gpuyard.runtimes.fleet import Fleet, HostEngine
from gpuyard.runtimes.slurm.host_nodes import HostNodes
from gpuyard.services.access.ssh_keys import add_key
from gpuyard.services.clusters.moves import drain_host
from gpuyard.services.context import Context
from gpuyard.services.tenancy.auth import Principal
from gpuyard.services.training import use_cases as training
from gpuyard.store.schema import GpuAllocation, Host, ImageVersion, TrainingNode
from gpuyard.testing.fake_nodes import FakeNodeRuntime
from gpuyard.testing.fake_runtime import FakeRuntime
from tests.conftest import new_operator
from tests.helpers import add_host_row
from tests.service.test_training_operator import KEY, FakeEdge

A = "NVIDIA RTX A6000"


class Span:
    """Hosts of location ``lab`` with 2 GPUs each, in memory; one node runtime each."""

    def __init__(self, ctx: Context, alice: Principal, hosts: int = 3) -> None:
        self.ctx, self.alice = ctx, alice
        self.admin = new_operator(ctx)
        self.hosts = [add_host_row(ctx, f"h{i}", 2) for i in range(1, hosts + 1)]
        self.engines: dict[int, FakeRuntime] = {}
        self.nodes: dict[int, FakeNodeRuntime] = {}
        self.every: list[FakeNodeRuntime] = []
        self.local = FakeNodeRuntime()
        self.reconciler = build_reconciler(ctx, Fleet(FakeRuntime(), self._engine))
        host_nodes = HostNodes(self.reconciler.fleet, self.local, self._nodes)
        self.operator = TrainingOperator(
            ctx, self.local, FakeEdge(), drain_timeout_s=0, hosts=host_nodes
        )
        with ctx.transaction() as s:
            self.key = add_key(s, alice.account_id, "k1", KEY, user_id=alice.user_id).id
            image = s.scalar(select(ImageVersion).order_by(ImageVersion.id))
            assert image is not None
            self.image = image.id
        self.scope = training.Scope(project_id=alice.default_project_id, location="lab")

    def add_host(self, name: str) -> int:
        host = add_host_row(self.ctx, name, 2)
        self.hosts.append(host)
        return host

    def _engine(self, host: HostEngine) -> FakeRuntime:
        return self.engines.setdefault(host.host_id, FakeRuntime())

    def _nodes(self, runtime: Runtime) -> FakeNodeRuntime:
        host_id = next(h for h, rt in self.engines.items() if rt is runtime)
        if host_id not in self.nodes:
            # One Slurm: each host's controller sees the workers of every host.
            self.nodes[host_id] = FakeNodeRuntime(slurm_peers=self.every)
            self.every.append(self.nodes[host_id])
        return self.nodes[host_id]

    def create(self, workers: int, gpus: int = 2, ctx: Context | None = None) -> int:
        return training.create_cluster(
            ctx or self.ctx,
            self.alice,
            self.scope,
            {
                "name": "big",
                "image_version_id": self.image,
                "ssh_key_ids": [self.key],
                "no_of_nodes": workers,
                "gpu_type": A,
                "gpus_per_node": gpus,
                "cpus_per_node": 2,
                "memory_gb_per_node": 4,
            },
        )

    def placement(self, cid: int) -> dict[str, int | None]:
        with self.ctx.read() as s:
            rows = s.scalars(select(TrainingNode).where(TrainingNode.cluster_id == cid))
            return {n.name: n.host_id for n in rows}

    def address(self, host_id: int) -> str:
        with self.ctx.read() as s:
            host = s.get(Host, host_id)
            assert host is not None
            return host.address

    def run(self, cid: int) -> None:
        self.operator.run(cid)
        with self.ctx.read() as s:
            row = s.get(training.TrainingCluster, cid)
            assert row is not None
            assert row.status == "running" and row.operation is None, row.error_message


@pytest.fixture
def span(ctx: Context, alice: Principal) -> Span:
    return Span(ctx, alice)


def test_a_cluster_bigger_than_any_host_spans_hosts_and_one_network(span: Span) -> None:
    cid = span.create(workers=3)  # 3 x 2 GPUs; each host has 2
    where = span.placement(cid)
    names = NodeName(cid, span.ctx.ownership.training_prefix(cid))
    workers = [names.worker(i) for i in (1, 2, 3)]
    assert sorted(where[w] for w in workers) == sorted(span.hosts)  # one per host
    span.run(cid)

    # Every node was created on the engine of its own host, none on this machine's.
    assert span.local.created == []
    for host in span.hosts:
        made = sorted(span.nodes[host].nodes)
        assert made == sorted(n for n, h in where.items() if h == host)
    # One subnet, the same network on each host, each joined to the other two.
    subnets = {nodes.subnets[names.network] for nodes in span.nodes.values()}
    assert len(subnets) == 1
    for host in span.hosts:
        overlay = span.nodes[host].overlays[names.network]
        assert overlay.local == span.address(host)
        others = {span.address(h) for h in span.hosts if h != host}
        assert set(overlay.peers) == others
    # Fixed, distinct addresses; every node knows every other by name.
    specs = {n: node.spec for rt in span.nodes.values() for n, node in rt.nodes.items()}
    addresses = {n: s.address for n, s in specs.items()}
    assert len(set(addresses.values())) == 4 and None not in addresses.values()
    for name, spec in specs.items():
        assert spec.hosts == addresses, name


def test_a_cluster_that_fits_nowhere_is_refused_and_holds_nothing(span: Span) -> None:
    with pytest.raises(InsufficientCapacity) as caught:
        span.create(workers=4)  # 8 GPUs; the location has 6
    error = caught.value
    assert "each worker 2 GPU(s)" in error.message
    available = {a["host_id"]: a["gpus"] for a in error.details["available"]}
    assert available == {h: {A: 2} for h in span.hosts}
    with span.ctx.read() as s:
        assert s.scalar(select(func.count()).select_from(TrainingNode)) == 0
        held = s.scalar(
            select(func.count())
            .select_from(GpuAllocation)
            .where(GpuAllocation.host_id.in_(span.hosts))
        )
        assert held == 0


def test_scale_puts_a_worker_on_the_only_host_with_room(span: Span) -> None:
    cid = span.create(workers=3)
    span.run(cid)
    names = NodeName(cid, span.ctx.ownership.training_prefix(cid))
    fourth = span.add_host("h4")
    training.perform_action(
        span.ctx, span.alice, span.scope, cid, {"action": "scale_cluster", "additional_nodes": 1}
    )
    assert span.placement(cid)[names.worker(4)] == fourth
    before = {h: dict(span.nodes[h].nodes) for h in span.hosts[:3]}
    span.run(cid)
    new = span.nodes[fourth].nodes[names.worker(4)]
    # The others kept running (not recreated) and learned the new node's address.
    for host, nodes in before.items():
        for name, node in nodes.items():
            assert span.nodes[host].nodes[name] is node
            assert node.hosts[names.worker(4)] == new.spec.address
    assert set(span.nodes[fourth].overlays[names.network].peers) == {
        span.address(h) for h in span.hosts[:3]
    }


def test_spread_spreads_nodes_binpack_keeps_them_together(ctx: Context, alice: Principal) -> None:
    span = Span(ctx, alice, hosts=2)  # 2 GPUs each
    spread_ctx = dataclasses.replace(
        ctx, settings=ctx.settings.model_copy(update={"placement_policy": PlacementPolicy.SPREAD})
    )
    apart = span.create(workers=2, gpus=1, ctx=spread_ctx)
    names = NodeName(apart, ctx.ownership.training_prefix(apart))
    where = span.placement(apart)
    assert where[names.worker(1)] != where[names.worker(2)]
    training.delete_cluster(ctx, alice, span.scope, apart)
    span.operator.run(apart)

    together = span.create(workers=2, gpus=1)
    assert len(set(span.placement(together).values())) == 1


def test_a_drained_hosts_worker_is_recreated_on_another_host_same_name_and_address(
    span: Span,
) -> None:
    cid = span.create(workers=3)
    span.run(cid)
    names = NodeName(cid, span.ctx.ownership.training_prefix(cid))
    worker = names.worker(2)
    left = span.placement(cid)[worker]
    old = span.nodes[left].nodes[worker]
    others = {n: span.nodes[h].nodes[n] for n, h in span.placement(cid).items() if n != worker}
    fourth = span.add_host("h4")

    report = drain_host(span.ctx, span.admin, left)
    assert [m.name for m in report.training.moving] == [worker]
    assert span.placement(cid)[worker] == fourth
    span.run(cid)

    assert worker not in span.nodes[left].nodes  # gone from the host it left
    new = span.nodes[fourth].nodes[worker]
    assert new.spec.address == old.spec.address  # same name, same address
    # The other nodes were not recreated; the new host joined the cluster's network.
    for name, node in others.items():
        assert span.nodes[span.placement(cid)[name] or 0].nodes[name] is node
    assert names.network in span.nodes[fourth].overlays


def test_a_cluster_from_before_spanning_stays_on_its_host(span: Span) -> None:
    cid = span.create(workers=1, gpus=1)
    span.run(cid)
    with span.ctx.transaction() as s:  # as a cluster made before subnets of its own
        row = s.get(training.TrainingCluster, cid)
        assert row is not None
        row.subnet = None
    host = span.placement(cid)[NodeName(cid, span.ctx.ownership.training_prefix(cid)).worker(1)]
    assert host is not None
    report = drain_host(span.ctx, span.admin, host)
    assert report.training.moving == []
    assert ["made before training clusters spanned hosts" in s.reason
            for s in report.training.cannot_move if s.role == "worker"] == [True]  # fmt: skip
    # Nor does a scale take it to another host (its own drains: no room anywhere for it).
    with pytest.raises(InsufficientCapacity):
        training.perform_action(
            span.ctx, span.alice, span.scope, cid,
            {"action": "scale_cluster", "additional_nodes": 1},
        )  # fmt: skip
    assert set(span.placement(cid).values()) == {host}


def test_a_host_the_others_cannot_reach_takes_no_part_of_a_spanning_cluster(
    span: Span,
) -> None:
    with span.ctx.transaction() as s:  # as this machine's own host, without a public address
        host = s.get(Host, span.hosts[0])
        assert host is not None
        host.address = "127.0.0.1"
    with pytest.raises(InsufficientCapacity) as caught:
        span.create(workers=3)  # needs all three hosts; one cannot join the overlay
    available = {a["host_id"] for a in caught.value.details["available"]}
    assert span.hosts[0] not in available
    # On one host alone it still takes a cluster (no overlay needed).
    single = span.create(workers=1)
    assert set(span.placement(single).values()) <= set(span.hosts)


def test_a_cluster_on_a_host_the_others_cannot_reach_still_scales_there(span: Span) -> None:
    with span.ctx.transaction() as s:
        for host_id in span.hosts[1:]:  # only the first host has room for the nodes
            host = s.get(Host, host_id)
            assert host is not None
            host.status = "cordoned"
        first = s.get(Host, span.hosts[0])
        assert first is not None
        first.address = "127.0.0.1"  # as this machine's own host
    cid = span.create(workers=1, gpus=1)
    span.run(cid)
    training.perform_action(
        span.ctx, span.alice, span.scope, cid, {"action": "scale_cluster", "additional_nodes": 1}
    )
    assert set(span.placement(cid).values()) == {span.hosts[0]}
