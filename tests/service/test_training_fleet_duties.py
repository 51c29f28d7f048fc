"""Fleet duties cover training nodes: a node on an unreachable host shows it and bills
nothing from the host's last answered heartbeat until it answers again (the cluster's
other nodes bill on); cordon keeps new nodes off a host; drain moves a host's workers
to other hosts of the location (claims moved, the operator told which node left which
host) or says per node what cannot move and why, and tries again while the host
drains; a host still holding training nodes is not deleted and names them. Real
database (SQLite and PostgreSQL), in-memory engines per host."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import select

from gpuyard.api.rest.schemas.hosts import TrainingDrainOut
from gpuyard.core.errors import HostNotEmpty, InsufficientCapacity
from gpuyard.core.training.clusters import cluster_owner, node_owner
from gpuyard.services.clock import FakeClock
from gpuyard.services.clusters.moves import drain_host
from gpuyard.services.context import Context
from gpuyard.services.fleet.admin import cordon, delete_host, uncordon
from gpuyard.services.training import stops as training_stops
from gpuyard.services.training import use_cases as training
from gpuyard.services.training.drain import MOVE_NODES
from gpuyard.services.training.reads import show_cluster
from gpuyard.store.schema import (
    Event,
    GpuAllocation,
    Reservation,
    TrainingCluster,
    TrainingNode,
    UsageInterval,
)
from tests.helpers import add_host_row
from tests.service.test_training_fleet import World


@pytest.fixture
def world(ctx: Context, alice: Any) -> World:
    return World(ctx, alice)


def nodes(ctx: Context, cid: int) -> dict[str, TrainingNode]:
    """The cluster's nodes by role and number: controller, worker-1, worker-2..."""
    with ctx.read() as s:
        rows = list(s.scalars(select(TrainingNode).where(TrainingNode.cluster_id == cid)))
        s.expunge_all()
    return {short(n.name): n for n in rows}


def short(name: str) -> str:
    """``controller`` or ``worker-N`` (fewer than ten workers here)."""
    return "controller" if name.endswith("-controller") else name[-8:]


def open_meters(ctx: Context, holder: str) -> list[UsageInterval]:
    with ctx.read() as s:
        rows = list(
            s.scalars(
                select(UsageInterval).where(
                    UsageInterval.cluster_id == holder, UsageInterval.ended_at.is_(None)
                )
            )
        )
        s.expunge_all()
    return rows


def ends(ctx: Context, holder: str) -> set[Any]:
    with ctx.read() as s:
        return set(
            s.scalars(select(UsageInterval.ended_at).where(UsageInterval.cluster_id == holder))
        )


def shown_nodes(world: World, cid: int) -> dict[str, dict[str, Any]]:
    view = show_cluster(world.ctx, world.alice, world.scope, cid, None)
    return {n["name"].rsplit("-", 1)[-1]: n for n in view["nodes"]}


def events(ctx: Context, cid: int) -> list[str]:
    with ctx.read() as s:
        return list(
            s.scalars(
                select(Event.message)
                .where(Event.cluster_id == cluster_owner(cid))
                .order_by(Event.id)
            )
        )


def lose(world: World, host_id: int, clock: FakeClock) -> None:
    """The host's engine stops answering until it counts as unreachable."""
    world.engines[host_id].unavailable = "no route to host"
    for _ in range(world.ctx.settings.heartbeat_misses):
        clock.advance(5)
        world.reconciler.heartbeat_now()


def test_nodes_on_an_unreachable_host_show_it_and_bill_nothing_until_it_answers(
    world: World, clock: FakeClock
) -> None:
    cid = world.create(workers=2)
    world.running(cid)
    # (A controller has no GPU; the test's prices bill GPUs only.)
    holders = [node_owner(n.id) for n in nodes(world.ctx, cid).values() if n.role == "worker"]
    assert len(holders) == 2 and all(open_meters(world.ctx, h) for h in holders)
    clock.advance(30)
    world.reconciler.heartbeat_now()
    answered_at = clock.now().replace(microsecond=0)
    assert {n["host_status"] for n in shown_nodes(world, cid).values()} == {"reachable"}

    lose(world, world.h2, clock)
    for holder in holders:
        assert open_meters(world.ctx, holder) == []  # paused...
        assert ends(world.ctx, holder) == {answered_at}  # ...from the last answer
    shown = shown_nodes(world, cid)
    assert {n["host_status"] for n in shown.values()} == {"unreachable"}
    assert {(n["host_id"], n["host"]) for n in shown.values()} == {(world.h2, "h2")}
    said = events(world.ctx, cid)
    assert any("unreachable" in m and "billing is paused" in m for m in said)
    # The cluster keeps its status and its GPUs (the engine may still run the nodes).
    assert world.row(cid).status == "running"
    with world.ctx.read() as s:
        held = s.scalars(select(GpuAllocation.gpu_index).where(GpuAllocation.host_id == world.h2))
        assert sorted(held) == [0, 1]

    world.engines[world.h2].unavailable = None
    clock.advance(60)
    world.reconciler.heartbeat_now()
    back = clock.now().replace(microsecond=0)
    for holder in holders:
        [reopened] = open_meters(world.ctx, holder)
        assert reopened.started_at == back
    assert {n["host_status"] for n in shown_nodes(world, cid).values()} == {"reachable"}
    assert any("answers again" in m for m in events(world.ctx, cid))


def test_a_moved_worker_pauses_with_its_own_host_while_the_others_bill_on(
    world: World, clock: FakeClock
) -> None:
    cid = world.create(workers=2)
    world.running(cid)
    h3 = add_host_row(world.ctx, "h3", 1)  # room for one worker
    drain_host(world.ctx, world.admin, world.h2)
    uncordon(world.ctx, world.admin, world.h2)
    found = nodes(world.ctx, cid)
    moved, kept = found["worker-1"], found["worker-2"]
    assert (moved.host_id, kept.host_id) == (h3, world.h2)
    world.reconciler.heartbeat_now()

    lose(world, h3, clock)
    assert open_meters(world.ctx, node_owner(moved.id)) == []
    assert open_meters(world.ctx, node_owner(kept.id))
    shown = shown_nodes(world, cid)
    assert shown["1"]["host_status"] == "unreachable" and shown["1"]["host"] == "h3"
    assert shown["2"]["host_status"] == "reachable" and shown["2"]["host"] == "h2"
    assert shown["controller"]["host_status"] == "reachable"


def test_cordon_keeps_new_nodes_off_a_host(world: World) -> None:
    h3 = add_host_row(world.ctx, "h3", 4)
    cordon(world.ctx, world.admin, world.h2)
    cid = world.create(workers=2)
    assert {n.host_id for n in nodes(world.ctx, cid).values()} == {h3}
    world.running(cid)

    cordon(world.ctx, world.admin, h3)
    with pytest.raises(InsufficientCapacity):
        world.act(cid, action="scale_cluster", additional_nodes=1)
    assert len(nodes(world.ctx, cid)) == 3  # nothing was added


def test_drain_moves_the_workers_claims_to_another_host_and_the_controller_stays(
    world: World,
) -> None:
    cid = world.create(workers=2)
    world.running(cid)
    h3 = add_host_row(world.ctx, "h3", 4)
    before = nodes(world.ctx, cid)

    report = drain_host(world.ctx, world.admin, world.h2)
    w1, w2, ctl = before["worker-1"], before["worker-2"], before["controller"]
    moving = [(m.node_id, m.name, m.to_host_id) for m in report.training.moving]
    assert moving == [(w1.id, w1.name, h3), (w2.id, w2.name, h3)]
    [stays] = report.training.cannot_move
    assert (stays.node_id, stays.role) == (ctl.id, "controller")
    assert "Slurm state" in stays.reason
    # The drain's answer has the API's shape.
    TrainingDrainOut.model_validate(
        {
            "moving": [m.__dict__ for m in report.training.moving],
            "cannot_move": [n.__dict__ for n in report.training.cannot_move],
        }
    )

    after = nodes(world.ctx, cid)
    with world.ctx.read() as s:
        for node in (after["worker-1"], after["worker-2"]):
            assert node.host_id == h3 and node.status == "replacing"
            reservation = s.get(Reservation, node_owner(node.id))
            assert reservation is not None and reservation.host_id == h3
            held = s.scalars(
                select(GpuAllocation.host_id).where(GpuAllocation.cluster_id == node_owner(node.id))
            )
            assert list(held) == [h3]
            assert len(node.gpu_indices) == 1
        # Nothing of the workers is left on the drained host; the controller is.
        left = s.scalars(select(Reservation.cluster_id).where(Reservation.host_id == world.h2))
        assert set(left) == {node_owner(ctl.id)}
    assert after["controller"].host_id == world.h2
    # Same names, and the operator is told what to recreate and where each came from.
    assert {n.name for n in after.values()} == {n.name for n in before.values()}
    row = world.row(cid)
    assert row.status == "restarting" and row.operation is not None
    assert row.operation["action"] == MOVE_NODES
    assert row.operation["nodes"] == [w1.id, w2.id]
    assert row.operation["from_hosts"] == {str(w1.id): world.h2, str(w2.id): world.h2}
    said = events(world.ctx, cid)
    assert any(f"worker {w1.name} moves from host h2" in m and "h3" in m for m in said)
    # Billing goes on as it was (one interval per meter, still open).
    assert open_meters(world.ctx, node_owner(w1.id))

    # Again: the workers are gone from the host; only the controller stays.
    again = drain_host(world.ctx, world.admin, world.h2)
    assert again.training.moving == []
    assert [n.node_id for n in again.training.cannot_move] == [ctl.id]


def test_what_cannot_move_says_why_and_moves_once_it_can(world: World) -> None:
    cid = world.create(workers=2)
    world.running(cid)
    h3 = add_host_row(world.ctx, "h3", 4, status="cordoned")

    report = drain_host(world.ctx, world.admin, world.h2)
    assert report.training.moving == []
    why = {short(n.name): n.reason for n in report.training.cannot_move}
    assert "no other host of location 'lab' has room" in why["worker-1"]
    assert "no other host of location 'lab' has room" in why["worker-2"]
    assert world.row(cid).status == "running"  # nothing recorded

    # Room appears: the next scan of the draining host's engine moves them.
    uncordon(world.ctx, world.admin, h3)
    world.reconciler.heartbeat_now()
    found = nodes(world.ctx, cid)
    assert found["worker-1"].host_id == h3 and found["worker-2"].host_id == h3
    assert world.row(cid).operation is not None


def test_one_worker_moves_when_only_one_fits(world: World) -> None:
    cid = world.create(workers=2)
    world.running(cid)
    add_host_row(world.ctx, "h3", 1)
    report = drain_host(world.ctx, world.admin, world.h2)
    assert [short(m.name) for m in report.training.moving] == ["worker-1"]
    stays = {short(n.name): n.reason for n in report.training.cannot_move}
    assert set(stays) == {"worker-2", "controller"}
    # The one that stayed keeps its place on the drained host, whole.
    with world.ctx.read() as s:
        w2 = nodes(world.ctx, cid)["worker-2"]
        reservation = s.get(Reservation, node_owner(w2.id))
        assert reservation is not None and reservation.host_id == world.h2
        assert w2.status == "running" and w2.host_id == world.h2
    # The cluster now runs the move: the rest waits for it, and says so.
    again = drain_host(world.ctx, world.admin, world.h2)
    stays = {short(n.name): n.reason for n in again.training.cannot_move}
    assert "restarting (move_nodes)" in stays["worker-2"]


def test_workers_on_a_host_that_does_not_answer_stay(world: World, clock: FakeClock) -> None:
    cid = world.create(workers=1)
    world.running(cid)
    add_host_row(world.ctx, "h3", 4)
    world.reconciler.heartbeat_now()
    lose(world, world.h2, clock)
    report = drain_host(world.ctx, world.admin, world.h2)
    assert report.training.moving == []
    [why] = [n.reason for n in report.training.cannot_move if n.role == "worker"]
    assert "does not answer" in why
    assert nodes(world.ctx, cid)["worker-1"].host_id == world.h2


def test_a_stopped_clusters_workers_are_pointed_at_another_host(world: World) -> None:
    cid = world.create(workers=1)
    world.running(cid)
    assert training_stops.stop_cluster(world.ctx, cid, "account suspended")
    world.operator.run(cid)
    assert world.row(cid).status == "stopped"
    h3 = add_host_row(world.ctx, "h3", 4)
    report = drain_host(world.ctx, world.admin, world.h2)
    assert [(short(m.name), m.to_host_id) for m in report.training.moving] == [("worker-1", h3)]
    # It holds nothing, and nothing is claimed for it until the cluster starts.
    found = nodes(world.ctx, cid)["worker-1"]
    assert found.host_id == h3 and found.gpu_indices == []
    with world.ctx.read() as s:
        assert s.get(Reservation, node_owner(found.id)) is None
    assert world.row(cid).status == "stopped"


def test_a_busy_cluster_waits_for_its_operation(world: World) -> None:
    cid = world.create(workers=1)
    world.running(cid)
    add_host_row(world.ctx, "h3", 4)
    world.act(cid, action="restart_workers")
    report = drain_host(world.ctx, world.admin, world.h2)
    [why] = [n.reason for n in report.training.cannot_move if n.role == "worker"]
    assert "restarting (restart_workers)" in why
    world.running(cid)  # the restart ends; the next scan moves the worker
    world.reconciler.heartbeat_now()
    with world.ctx.read() as s:
        row = s.get(TrainingCluster, cid)
        assert row is not None and row.operation is not None
        assert row.operation["action"] == MOVE_NODES


def test_a_host_with_training_nodes_is_not_deleted_and_names_them(world: World) -> None:
    cid = world.create(workers=1)
    world.running(cid)
    found = nodes(world.ctx, cid)
    with pytest.raises(HostNotEmpty) as refused:
        delete_host(world.ctx, world.admin, world.h2)
    details = refused.value.details
    assert details is not None
    listed = details["left"]["training_nodes"]
    assert listed == [
        {
            "node_id": n.id,
            "name": n.name,
            "role": n.role,
            "training_cluster_id": cid,
        }
        for n in sorted(found.values(), key=lambda n: n.id)
    ]
    assert found["worker-1"].name in refused.value.message

    training.delete_cluster(world.ctx, world.alice, world.scope, cid)
    world.operator.run(cid)
    assert delete_host(world.ctx, world.admin, world.h2)["deleted"] is True
