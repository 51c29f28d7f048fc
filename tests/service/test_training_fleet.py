"""Training clusters on a fleet: a cluster placed on a remote host runs every node
(controller and workers) on that host's engine, through that host's runtime, for every
operation and for recovery; the node image is copied to a host that lacks it once per
host and image version, with the copy shown in the cluster's status reason. Real
database (SQLite and PostgreSQL), in-memory engines and node runtimes per host."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import pytest
from sqlalchemy import select

from gpuyard.core.training.clusters import NodeName
from gpuyard.reconciler.lanes import SLOW
from gpuyard.reconciler.training.operator import TrainingOperator
from gpuyard.reconciler.wiring import build_reconciler
from gpuyard.runtimes.base import Runtime
from gpuyard.runtimes.fleet import Fleet, HostEngine
from gpuyard.runtimes.slurm.host_nodes import HostNodes
from gpuyard.services.access.ssh_keys import add_key
from gpuyard.services.catalog.images import register_image
from gpuyard.services.context import Context
from gpuyard.services.tenancy.auth import Principal
from gpuyard.services.training import stops as training_stops
from gpuyard.services.training import use_cases as training
from gpuyard.store.schema import ImageVersion, TrainingCluster
from gpuyard.testing.fake_nodes import FakeNodeRuntime
from gpuyard.testing.fake_runtime import FakeRuntime
from tests.conftest import new_operator
from tests.helpers import add_host_row
from tests.service.test_training_operator import KEY, FakeEdge
from tests.service.test_training_recovery import HeldQueue

A = "NVIDIA RTX A6000"


class RemoteNodes(FakeNodeRuntime):
    """A remote host's node runtime whose engine starts with no image, recording the
    cluster's status reason each time a copy reports progress."""

    def __init__(self, reason: Callable[[], str]) -> None:
        super().__init__(images=set())
        self._reason = reason
        self.reasons_while_copying: list[str] = []

    def ensure_image(self, image: str, progress: Callable[[str], None] | None = None) -> bool:
        def watched(text: str) -> None:
            assert progress is not None
            progress(text)
            self.reasons_while_copying.append(self._reason())

        return super().ensure_image(image, watched if progress is not None else None)


class World:
    """One local host (location ``local``) and one remote host ``h2`` (location ``lab``),
    each engine in memory; the node runtime of every host made from its runtime."""

    def __init__(self, ctx: Context, alice: Principal) -> None:
        self.ctx = ctx
        self.alice = alice
        self.admin = new_operator(ctx)
        self.h2 = add_host_row(ctx, "h2", 4, location="lab")
        self.engines: dict[int, FakeRuntime] = {}
        self.reconciler = build_reconciler(ctx, Fleet(FakeRuntime(), self._engine))
        self.local_nodes = FakeNodeRuntime()
        self.remote_nodes: dict[int, RemoteNodes] = {}
        self.made_from: list[Runtime] = []
        self.cluster_id: int | None = None
        self.hosts = HostNodes(self.reconciler.fleet, self.local_nodes, self._nodes)
        self.operator = TrainingOperator(
            ctx, self.local_nodes, FakeEdge(), drain_timeout_s=0, hosts=self.hosts
        )
        with ctx.transaction() as s:
            key = add_key(s, alice.account_id, "k1", KEY, user_id=alice.user_id)
            image = s.scalar(select(ImageVersion).order_by(ImageVersion.id))
            assert image is not None
            other = register_image(s, name="slurm-node", version="v2", image="localhost/x:v2")
            self.key, self.image, self.image2 = key.id, image.id, other.id
            self.image_name, self.image2_name = image.image, other.image
        self.scope = training.Scope(project_id=alice.default_project_id, location="lab")

    def _engine(self, host: HostEngine) -> FakeRuntime:
        return self.engines.setdefault(host.host_id, FakeRuntime())

    def _nodes(self, runtime: Runtime) -> RemoteNodes:
        self.made_from.append(runtime)
        host_id = next(h for h, rt in self.engines.items() if rt is runtime)
        return self.remote_nodes.setdefault(host_id, RemoteNodes(self.reason))

    def reason(self) -> str:
        return self.row(self.cluster_id).status_reason if self.cluster_id else ""

    def row(self, cluster_id: int | None) -> TrainingCluster:
        with self.ctx.read() as s:
            row = s.get(TrainingCluster, cluster_id)
            assert row is not None
            s.expunge(row)
            return row

    def create(self, name: str = "t", workers: int = 2) -> int:
        cid = training.create_cluster(
            self.ctx,
            self.alice,
            self.scope,
            {
                "name": name,
                "image_version_id": self.image,
                "ssh_key_ids": [self.key],
                "no_of_nodes": workers,
                "gpu_type": A,
                "gpus_per_node": 1,
                "cpus_per_node": 2,
                "memory_gb_per_node": 4,
            },
        )
        self.cluster_id = cid
        return cid

    def act(self, cid: int, **body: Any) -> None:
        training.perform_action(self.ctx, self.alice, self.scope, cid, body)

    def running(self, cid: int) -> TrainingCluster:
        self.operator.run(cid)
        row = self.row(cid)
        assert row.status == "running" and row.operation is None, row.error_message
        return row


@pytest.fixture
def world(ctx: Context, alice: Principal) -> World:
    return World(ctx, alice)


def test_a_cluster_placed_on_a_remote_host_runs_its_nodes_there_only(world: World) -> None:
    cid = world.create(workers=2)
    row = world.row(cid)
    assert row.host_id == world.h2  # placed where its location's capacity is
    world.running(cid)

    # Nothing ran on this machine's engine.
    assert world.local_nodes.created == [] and world.local_nodes.networks == set()
    remote = world.remote_nodes[world.h2]
    prefix = f"{world.ctx.ownership.prefix}-tc{cid}"
    assert sorted(remote.nodes) == [
        f"{prefix}-controller",
        f"{prefix}-worker-1",
        f"{prefix}-worker-2",
    ]
    assert remote.networks == {NodeName(cid, row.name_prefix).network}
    # The host's node runtime was made from the runtime the fleet has for that host
    # (its SSH tunnel, TLS, labels).
    assert world.made_from == [world.engines[world.h2]]
    assert remote.owner == world.ctx.ownership
    # The image went to the host once, and the status said so while it was copied.
    assert remote.copied == [world.image_name]
    assert remote.reasons_while_copying and all(
        r.startswith(f"copying image {world.image_name} to the host")
        for r in remote.reasons_while_copying
    )


def test_every_operation_and_recovery_goes_through_the_hosts_runtime(world: World) -> None:
    cid = world.create(workers=1)
    world.running(cid)
    remote = world.remote_nodes[world.h2]
    prefix = f"{world.ctx.ownership.prefix}-tc{cid}"

    world.act(cid, action="scale_cluster", additional_nodes=1)
    world.running(cid)
    assert f"{prefix}-worker-2" in remote.nodes

    world.act(cid, action="restart_workers")
    world.running(cid)
    assert remote.nodes[f"{prefix}-worker-1"].restarts == 1

    world.act(cid, action="update_image", image_version_id=world.image2)
    world.running(cid)
    assert {n.spec.image for n in remote.nodes.values()} == {world.image2_name}
    # Each image version copied once; the Slurm commands ran on the host's controller.
    assert remote.copied == [world.image_name, world.image2_name]
    assert any("state=drain" in argv for _, argv in remote.execs)

    # A dead node is seen on, and brought back on, the host's engine.
    remote.kill(f"{prefix}-worker-1")
    assert world.operator.recovery.wanted(cid)
    world.operator.recover(cid)
    assert remote.nodes[f"{prefix}-worker-1"].state == "running"
    assert world.operator.partition_state(cid, max_age_s=0) is not None

    # Stop and start: the nodes go from and come back to the host.
    assert training_stops.stop_cluster(world.ctx, cid, "account suspended")
    world.operator.run(cid)
    assert world.row(cid).status == "stopped" and remote.nodes == {}
    world.act(cid, action="restart_cluster")  # a stopped cluster's start
    world.running(cid)
    assert len(remote.nodes) == 3

    training.delete_cluster(world.ctx, world.alice, world.scope, cid)
    world.operator.run(cid)
    assert remote.nodes == {} and remote.networks == set()
    assert world.local_nodes.created == [] and world.local_nodes.execs == []


def test_the_image_is_copied_once_per_host_and_version(world: World) -> None:
    first = world.create("a", workers=1)
    world.running(first)
    second = world.create("b", workers=1)
    world.running(second)
    assert world.remote_nodes[world.h2].copied == [world.image_name]
    assert len(world.made_from) == 1  # one node runtime per host


def test_a_cluster_on_this_machine_keeps_the_local_node_runtime(world: World, ctx: Context) -> None:
    world.scope = training.Scope(project_id=world.alice.default_project_id, location="local")
    cid = world.create(workers=1)
    world.running(cid)
    assert len(world.local_nodes.nodes) == 2 and world.local_nodes.copied == []
    assert world.remote_nodes == {} and world.made_from == []


def test_jobs_of_a_remote_cluster_queue_on_its_hosts_lane(world: World, ctx: Context) -> None:
    queue = HeldQueue()
    operator = TrainingOperator(
        ctx,
        world.local_nodes,
        FakeEdge(),
        hosts=world.hosts,
        queue=queue,
        lane_of=partial(world.reconciler.lane_of, SLOW),  # as the server wires it
    )
    cid = world.create(workers=1)
    operator.wake(cid)  # the service's wake after recording the create
    operator.scan()  # the periodic scan finds the recorded operation too
    assert [(key, lane) for key, lane, _ in queue.held] == [
        (("training", cid), f"slow:host:{world.h2}")
    ] * 2
    queue.run_held()
    assert world.row(cid).status == "running"
    assert len(world.remote_nodes[world.h2].nodes) == 2
