"""Training nodes that die between operations are brought back (issue 10, item 5): on a
real database with the in-memory node runtime. Real Slurm (a killed worker coming
back while a job runs on the other one) is exercised in tests/e2e/test_training_e2e.py.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Any

import pytest
from sqlalchemy import select

from gpuyard.core.training.clusters import NodeName
from gpuyard.reconciler.training.nodes import LANE
from gpuyard.reconciler.training.operator import TrainingOperator
from gpuyard.reconciler.workqueue import WorkQueue
from gpuyard.services.access.ssh_keys import add_key
from gpuyard.services.clock import FakeClock
from gpuyard.services.context import Context
from gpuyard.services.tenancy.auth import Principal
from gpuyard.services.training import nodes as training_nodes
from gpuyard.services.training import use_cases as training
from gpuyard.services.training.reads import show_cluster
from gpuyard.store.schema import Event, ImageVersion, TrainingNode
from gpuyard.testing.fake_nodes import FakeNodeRuntime
from tests.service.test_training_operator import KEY, FakeEdge, act, create, status


class HeldQueue(WorkQueue):
    """A work queue that only records what is submitted; the test runs the jobs."""

    def __init__(self) -> None:
        super().__init__({LANE: 1})
        self.held: list[tuple[Hashable, str, Callable[[], None]]] = []

    def submit(self, key: Hashable, lane: str, job: Callable[[], None]) -> bool:
        self.held.append((key, lane, job))
        return True

    def run_held(self) -> None:
        jobs, self.held = self.held, []
        for _, _, job in jobs:
            job()


@pytest.fixture
def nodes() -> FakeNodeRuntime:
    return FakeNodeRuntime()


@pytest.fixture
def queue() -> HeldQueue:
    return HeldQueue()


@pytest.fixture
def operator(ctx: Context, nodes: FakeNodeRuntime, queue: HeldQueue) -> TrainingOperator:
    return TrainingOperator(ctx, nodes, FakeEdge(), drain_timeout_s=0, queue=queue)


@pytest.fixture
def world(ctx: Context, alice: Principal) -> dict[str, Any]:
    with ctx.transaction() as s:
        key = add_key(s, alice.account_id, "k1", KEY, user_id=alice.user_id)
        image = s.scalar(select(ImageVersion).order_by(ImageVersion.id))
        assert image is not None
        return {
            "key": key.id,
            "image": image.id,
            "scope": training.Scope(project_id=alice.default_project_id, location="local"),
        }


def running_cluster(
    ctx: Context, alice: Principal, world: dict[str, Any], operator: TrainingOperator
) -> tuple[int, NodeName]:
    cid = create(ctx, alice, world, workers=2)
    operator.run(cid)
    assert status(ctx, cid).status == "running"
    # The key pass after an operation, done here: the scans below then queue
    # recoveries only.
    operator.node_keys.refresh(cid)
    return cid, NodeName(cid, ctx.ownership.training_prefix(cid))


def stored_nodes(ctx: Context, cid: int) -> dict[str, tuple[str, int]]:
    with ctx.read() as s:
        return {n.name: (n.status, n.restarts) for n in training_nodes.nodes_of(s, cid)}


def restart_events(ctx: Context, cid: int) -> list[str]:
    with ctx.read() as s:
        return list(
            s.scalars(
                select(Event.message)
                .where(Event.cluster_id == f"tc-{cid}", Event.type == "restart")
                .order_by(Event.id)
            )
        )


def test_a_dead_worker_is_recreated_counted_and_shown(
    ctx: Context,
    alice: Principal,
    world: dict[str, Any],
    operator: TrainingOperator,
    nodes: FakeNodeRuntime,
    queue: HeldQueue,
) -> None:
    cid, names = running_cluster(ctx, alice, world, operator)
    controller, other = nodes.nodes[names.controller], nodes.nodes[names.worker(2)]
    nodes.kill(names.worker(1))

    # The scan sees the dead worker and hands the cluster's job to the queue.
    operator.scan()
    assert [(key, lane) for key, lane, _ in queue.held] == [(("training", cid), "slow")]
    queue.run_held()

    revived = nodes.nodes[names.worker(1)]
    assert revived.state == "running" and revived.generation == 1
    assert revived.spec.gpu_indices and revived.spec.labels["gpuyard.role"] == "worker"
    assert revived.files["lifecycle.sh"][0] == b"echo hi > /tmp/hi"
    # Nothing else was touched: no restart, no new container.
    assert nodes.nodes[names.controller] is controller and controller.restarts == 0
    assert nodes.nodes[names.worker(2)] is other and other.restarts == 0
    assert stored_nodes(ctx, cid) == {
        names.controller: ("running", 0),
        names.worker(1): ("running", 1),
        names.worker(2): ("running", 0),
    }
    c = status(ctx, cid)
    assert c.status == "running" and c.operation is None
    events = restart_events(ctx, cid)
    assert events == [
        f"worker {names.worker(1)}: its container exited; recreating it (restart 1)",
        f"back in Slurm: {names.worker(1)} (restart 1)",
    ]
    # No status change: the cluster ran throughout.
    assert [
        e.to_status
        for e in training.event_page(ctx, alice, world["scope"], cid, per_page=5000).events
    ] == [
        "creating",
        "running",
        None,
        None,
    ]
    view = show_cluster(ctx, alice, world["scope"], cid, None)
    assert {n["name"]: n["restarts"] for n in view["nodes"]} == {
        names.controller: 0,
        names.worker(1): 1,
        names.worker(2): 0,
    }
    # The new container ran the lifecycle script, and its result is recorded.
    assert {n["name"]: n["lifecycle"]["status"] for n in view["nodes"]}[names.worker(1)] == (
        "succeeded"
    )

    # Healthy again: the next scan hands nothing to the queue.
    operator.scan()
    assert queue.held == []


def test_a_removed_controller_is_recreated_with_its_state_volume(
    ctx: Context,
    alice: Principal,
    world: dict[str, Any],
    operator: TrainingOperator,
    nodes: FakeNodeRuntime,
) -> None:
    cid, names = running_cluster(ctx, alice, world, operator)
    workers = {w: nodes.nodes[w] for w in (names.worker(1), names.worker(2))}
    removed_before = list(nodes.removed_volumes)
    nodes.kill(names.controller, remove=True)

    operator.recover(cid)

    controller = nodes.nodes[names.controller]
    assert controller.state == "running"
    assert controller.spec.state_volume == names.state_volume
    assert names.state_volume in nodes.volumes
    assert nodes.removed_volumes == removed_before  # the Slurm state (job queue) is kept
    assert all(nodes.nodes[w] is node and node.restarts == 0 for w, node in workers.items())
    # The new controller is told where each worker is.
    addressed = {
        argv[2].split("=", 1)[1]
        for name, argv in nodes.execs
        if name == names.controller and any(a.startswith("NodeAddr=") for a in argv)
    }
    assert addressed == set(workers)
    assert stored_nodes(ctx, cid)[names.controller] == ("running", 1)
    assert restart_events(ctx, cid)[0] == (
        f"controller {names.controller}: its container is gone; recreating it (restart 1)"
    )


def test_no_recovery_while_an_operation_is_recorded(
    ctx: Context,
    alice: Principal,
    world: dict[str, Any],
    operator: TrainingOperator,
    nodes: FakeNodeRuntime,
    queue: HeldQueue,
) -> None:
    cid, names = running_cluster(ctx, alice, world, operator)
    act(ctx, alice, world, cid, action="restart_workers")
    nodes.kill(names.worker(1), remove=True)
    created = list(nodes.created)

    operator.recover(cid)
    assert nodes.created == created and names.worker(1) not in nodes.nodes

    # The scan hands the cluster's one job to the queue: it runs the operation (which
    # itself recreates the missing worker), not a recovery.
    operator.scan()
    queue.run_held()
    assert status(ctx, cid).status == "running"
    assert nodes.node_state(names.worker(1)) == "running"
    assert restart_events(ctx, cid) == []
    assert stored_nodes(ctx, cid)[names.worker(1)] == ("running", 0)


def test_an_operation_requested_meanwhile_supersedes_the_recovery(
    ctx: Context,
    alice: Principal,
    world: dict[str, Any],
    operator: TrainingOperator,
    nodes: FakeNodeRuntime,
    queue: HeldQueue,
) -> None:
    cid, names = running_cluster(ctx, alice, world, operator)
    nodes.kill(names.worker(1))
    nodes.kill(names.worker(2))
    real_create = nodes.create_node

    def create_then_act(spec: Any, files: dict[str, tuple[bytes, int]]) -> str:
        out = real_create(spec, files)
        if spec.name == names.worker(1):
            act(ctx, alice, world, cid, action="restart_workers")
        return out

    nodes.create_node = create_then_act  # type: ignore[method-assign]
    queue.held.clear()  # the act's wake-up; the recovery's own hand-over comes next
    operator.recover(cid)
    # Cut short after worker 1: the operation runs next, as the cluster's job.
    assert nodes.node_state(names.worker(2)) == "exited"
    assert [key for key, _, _ in queue.held][-1] == ("training", cid)
    queue.run_held()
    c = status(ctx, cid)
    assert c.status == "running" and c.status_reason == "restart_workers done"
    assert nodes.node_state(names.worker(2)) == "running"


def test_attempts_back_off_exponentially(
    ctx: Context,
    alice: Principal,
    world: dict[str, Any],
    operator: TrainingOperator,
    nodes: FakeNodeRuntime,
    queue: HeldQueue,
    clock: FakeClock,
) -> None:
    cid, names = running_cluster(ctx, alice, world, operator)
    w1 = names.worker(1)
    nodes.kill(w1)
    operator.recover(cid)  # the first attempt is made at once
    assert stored_nodes(ctx, cid)[w1] == ("running", 1)

    nodes.kill(w1)
    operator.scan()
    assert queue.held == []  # 1 s after the last attempt at the earliest
    operator.recover(cid)
    assert nodes.node_state(w1) == "exited"
    clock.advance(1)
    operator.scan()
    assert len(queue.held) == 1
    queue.run_held()
    assert stored_nodes(ctx, cid)[w1] == ("running", 2)

    # A failed attempt counts too: the node shows error, then waits 4 s.
    nodes.kill(w1)
    clock.advance(1.5)
    operator.recover(cid)
    assert nodes.node_state(w1) == "exited"
    clock.advance(0.5)  # 2 s after the second attempt
    nodes.fail_create.add(w1)
    operator.recover(cid)
    assert stored_nodes(ctx, cid)[w1] == ("error", 2)
    assert restart_events(ctx, cid)[-1] == (
        f"{w1}: recreating it failed: could not create {w1}: injected failure; next attempt in 4 s"
    )
    clock.advance(3.9)
    operator.recover(cid)
    assert stored_nodes(ctx, cid)[w1] == ("error", 2)
    clock.advance(0.1)
    operator.recover(cid)
    assert stored_nodes(ctx, cid)[w1] == ("running", 3)
    assert nodes.node_state(w1) == "running"

    # Attempts older than the window no longer count: the next one is immediate.
    clock.advance(ctx.settings.restart_window_s)
    nodes.kill(w1)
    operator.recover(cid)
    assert stored_nodes(ctx, cid)[w1] == ("running", 4)


def test_an_unreachable_engine_is_not_a_death(
    ctx: Context,
    alice: Principal,
    world: dict[str, Any],
    operator: TrainingOperator,
    nodes: FakeNodeRuntime,
    queue: HeldQueue,
) -> None:
    cid, _ = running_cluster(ctx, alice, world, operator)
    created = list(nodes.created)
    nodes.unreachable = True
    operator.scan()
    assert queue.held == []
    operator.recover(cid)
    nodes.unreachable = False
    assert nodes.created == created
    assert {s for s, _ in stored_nodes(ctx, cid).values()} == {"running"}
    assert restart_events(ctx, cid) == []


def test_a_cluster_in_error_is_left_alone(
    ctx: Context,
    alice: Principal,
    world: dict[str, Any],
    operator: TrainingOperator,
    nodes: FakeNodeRuntime,
    queue: HeldQueue,
) -> None:
    """Its failed containers keep their logs; restart_cluster is how it comes back."""
    cid = create(ctx, alice, world, workers=2)
    names = NodeName(cid, ctx.ownership.training_prefix(cid))
    nodes.fail_create.add(names.worker(2))
    operator.run(cid)
    assert status(ctx, cid).status == "error"
    nodes.kill(names.worker(1))
    operator.scan()
    assert queue.held == []
    operator.recover(cid)
    assert nodes.node_state(names.worker(1)) == "exited"


def test_on_the_real_queue_recovery_waits_for_the_running_operation(
    ctx: Context, alice: Principal, world: dict[str, Any], nodes: FakeNodeRuntime
) -> None:
    """An operation's job holds the cluster's key: a worker that dies meanwhile is
    brought back only after the operation has finished, never beside it."""
    queue = WorkQueue({LANE: 4})
    operator = TrainingOperator(ctx, nodes, FakeEdge(), drain_timeout_s=0, queue=queue)
    cid, names = running_cluster(ctx, alice, world, operator)
    act(ctx, alice, world, cid, action="scale_cluster", additional_nodes=1)
    entered, release = threading.Event(), threading.Event()
    real_result = nodes.lifecycle_result

    def held_result(name: str) -> int | None:
        if name == names.worker(3):
            entered.set()
            assert release.wait(30)
        return real_result(name)

    nodes.lifecycle_result = held_result  # type: ignore[method-assign]
    try:
        operator.wake(cid)
        assert entered.wait(30)  # the scale waits on worker 3's lifecycle script
        nodes.kill(names.worker(1))
        operator.scan()
        operator.wake(cid)
        assert queue.busy(("training", cid))
        assert nodes.node_state(names.worker(1)) == "exited"
        assert restart_events(ctx, cid) == []
    finally:
        release.set()

    def back() -> bool:
        with ctx.read() as s:
            row = s.scalar(select(TrainingNode).where(TrainingNode.name == names.worker(1)))
            return row is not None and row.restarts == 1 and row.status == "running"

    # The queue's threads finish the operation, then the recovery (bounded wait).
    idle = threading.Event()
    for _ in range(600):
        if back() and not queue.busy(("training", cid)):
            break
        idle.wait(0.05)
    queue.close()
    assert back(), stored_nodes(ctx, cid)
    assert status(ctx, cid).status_reason == "scale_cluster done"
    assert nodes.node_state(names.worker(1)) == "running"
