"""The training operator on a real database (SQLite and PostgreSQL) with the in-memory
node runtime: what each operation does to nodes, capacity, meters and the edge, and
that it survives being cut short. Real Slurm is exercised in tests/e2e."""

from __future__ import annotations

import dataclasses
import ipaddress
import time
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import delete, func, select

from gpuyard.core.errors import (
    AccountSuspended,
    BudgetExhausted,
    InsufficientCapacity,
    InvalidState,
)
from gpuyard.core.training.clusters import NodeName
from gpuyard.reconciler.training.nodes import Superseded
from gpuyard.reconciler.training.operator import TrainingOperator
from gpuyard.runtimes.hosts.edge import ClusterEdge
from gpuyard.services.access.reserved_ips import allocate_reserved_ip
from gpuyard.services.access.security_groups import create_group
from gpuyard.services.access.ssh_keys import add_key
from gpuyard.services.billing import budgets, quotas
from gpuyard.services.catalog.images import register_image
from gpuyard.services.clock import FakeClock
from gpuyard.services.context import Context
from gpuyard.services.tenancy import accounts, members
from gpuyard.services.tenancy.auth import Principal, Scope, resolve_key
from gpuyard.services.training import nodes as training_nodes
from gpuyard.services.training import reads as training_reads
from gpuyard.services.training import stops as training_stops
from gpuyard.services.training import use_cases as training
from gpuyard.store.schema import (
    GpuAllocation,
    ImageVersion,
    PortAllocation,
    Reservation,
    SecurityGroup,
    TrainingCluster,
    TrainingNode,
    UsageInterval,
)
from gpuyard.testing.fake_nodes import FakeNodeRuntime
from tests.helpers import add_host_row

A = "NVIDIA RTX A6000"
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGe4tciPtcKsqalQ5MYQNCKBAGbS1rO94qvBwyD7hpHy k1"
KEY2 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIIiFnWfuFP/oHj4/cPWrNG4LfEHgYgkI5GcafWodg8r+ k2"


class FakeEdge:
    """The hosts' rules (runtimes/hosts/edge.py) in memory: every host's edge is this
    one; ``listeners`` shows what they let through: address -> (target, acl)."""

    def __init__(self) -> None:
        self.applied: dict[int, ClusterEdge] = {}
        self.hosts: list[int | None] = []

    def __call__(self, host_id: int | None) -> FakeEdge:
        self.hosts.append(host_id)
        return self

    def apply(self, edge: ClusterEdge) -> None:
        self.applied[edge.cluster_id] = edge

    def remove(self, cluster_id: int) -> None:
        self.applied.pop(cluster_id, None)

    def clusters(self) -> set[int]:
        return set(self.applied)

    def allows(self, cluster_id: int, source: str) -> bool:
        """Whether the cluster's rules, as they are now, let ``source`` in."""
        edge = self.applied.get(cluster_id)
        if edge is None:
            return False
        if edge.sources is None:
            return True
        return any(ipaddress.ip_address(source) in ipaddress.ip_network(n) for n in edge.sources)

    @property
    def listeners(self) -> dict[tuple[str, int], tuple[str, int, Callable[[str, int], bool]]]:
        """(address, port) -> (target, target port, acl asking the rules as they are now)."""
        found: dict[tuple[str, int], tuple[str, int, Callable[[str, int], bool]]] = {}
        for cid, edge in self.applied.items():
            for listener in edge.listeners:

                def acl(source: str, _port: int, cid: int = cid) -> bool:
                    return self.allows(cid, source)

                found[listener] = (edge.target, edge.target_port, acl)
        return found


@pytest.fixture
def nodes() -> FakeNodeRuntime:
    return FakeNodeRuntime()


@pytest.fixture
def edge() -> FakeEdge:
    return FakeEdge()


@pytest.fixture
def operator(ctx: Context, nodes: FakeNodeRuntime, edge: FakeEdge) -> TrainingOperator:
    op = TrainingOperator(ctx, nodes, edge, drain_timeout_s=0)
    return op


@pytest.fixture
def world(ctx: Context, alice: Principal) -> dict[str, Any]:
    ctx.settings.reserved_ips = "127.0.10.0/30"
    with ctx.transaction() as s:
        key = add_key(s, alice.account_id, "k1", KEY, user_id=alice.user_id)
        image = s.scalar(select(ImageVersion).order_by(ImageVersion.id))
        assert image is not None
        other = register_image(s, name="slurm-node", version="v2", image="localhost/x:v2")
        return {
            "key": key.id,
            "image": image.id,
            "image2": other.id,
            "scope": training.Scope(project_id=alice.default_project_id, location="local"),
        }


def create(ctx: Context, alice: Principal, world: dict[str, Any], workers: int = 2) -> int:
    return training.create_cluster(
        ctx,
        alice,
        world["scope"],
        {
            "name": "t",
            "image_version_id": world["image"],
            "ssh_key_ids": [world["key"]],
            "no_of_nodes": workers,
            "gpu_type": A,
            "gpus_per_node": 1,
            "cpus_per_node": 2,
            "memory_gb_per_node": 4,
            "lifecycle_script": "echo hi > /tmp/hi",
        },
    )


def status(ctx: Context, cluster_id: int) -> TrainingCluster:
    with ctx.read() as s:
        row = s.get(TrainingCluster, cluster_id)
        assert row is not None
        s.expunge(row)
        return row


def count(ctx: Context, model: Any, *where: Any) -> int:
    with ctx.read() as s:
        return int(s.scalar(select(func.count()).select_from(model).where(*where)) or 0)


def act(ctx: Context, alice: Principal, world: dict[str, Any], cid: int, **body: Any) -> Any:
    return training.perform_action(ctx, alice, world["scope"], cid, body)


def test_create_builds_every_node_and_opens_the_edge(
    ctx: Context,
    alice: Principal,
    world: dict[str, Any],
    operator: TrainingOperator,
    nodes: FakeNodeRuntime,
    edge: FakeEdge,
) -> None:
    cid = create(ctx, alice, world)
    assert count(ctx, GpuAllocation) == 2
    operator.run(cid)
    c = status(ctx, cid)
    assert c.status == "running" and c.operation is None, c.error_message
    names = sorted(nodes.nodes)
    assert names == [
        f"{ctx.ownership.prefix}-tc{cid}-controller",
        f"{ctx.ownership.prefix}-tc{cid}-worker-1",
        f"{ctx.ownership.prefix}-tc{cid}-worker-2",
    ]
    assert nodes.created[0].endswith("controller")  # the controller comes up first
    worker = nodes.nodes[f"{ctx.ownership.prefix}-tc{cid}-worker-1"]
    assert worker.spec.gpu_count == 1 and len(worker.spec.gpu_indices) == 1
    assert worker.spec.labels["gpuyard.role"] == "worker"
    assert set(worker.files) >= {"munge.key", "slurm.conf", "gres.conf", "authorized_keys"}
    assert worker.files["lifecycle.sh"][0] == b"echo hi > /tmp/hi"
    assert KEY in worker.authorized_keys
    controller = nodes.nodes[f"{ctx.ownership.prefix}-tc{cid}-controller"]
    assert controller.spec.state_volume and "gres.conf" not in controller.files
    # The SSH port listens and reaches the controller's sshd; no security group: open.
    assert list(edge.listeners) == [("0.0.0.0", c.ssh_port)]
    target, port, acl = edge.listeners[("0.0.0.0", c.ssh_port)]
    assert target.startswith("10.99.") and port == 22 and acl("203.0.113.9", c.ssh_port)
    # Every worker's GPUs are metered from placement on (vCPUs are free by default).
    open_gpu = (UsageInterval.ended_at.is_(None), UsageInterval.meter == "gpu")
    assert count(ctx, UsageInterval, *open_gpu) == 2


def test_scale_restart_image_keys(
    ctx: Context,
    alice: Principal,
    world: dict[str, Any],
    operator: TrainingOperator,
    nodes: FakeNodeRuntime,
) -> None:
    cid = create(ctx, alice, world, workers=1)
    operator.run(cid)
    first = nodes.nodes[f"{ctx.ownership.prefix}-tc{cid}-worker-1"]

    act(ctx, alice, world, cid, action="scale_cluster", additional_nodes=2)
    operator.run(cid)
    assert status(ctx, cid).status == "running"
    assert f"{ctx.ownership.prefix}-tc{cid}-worker-3" in nodes.nodes
    assert (
        nodes.nodes[f"{ctx.ownership.prefix}-tc{cid}-worker-1"] is first
    )  # running nodes untouched
    assert count(ctx, GpuAllocation) == 3
    with pytest.raises(InsufficientCapacity):
        act(ctx, alice, world, cid, action="scale_cluster", additional_nodes=2)
    assert count(ctx, GpuAllocation) == 3 and status(ctx, cid).status == "running"

    act(ctx, alice, world, cid, action="restart_workers")
    operator.run(cid)
    assert nodes.nodes[f"{ctx.ownership.prefix}-tc{cid}-controller"].restarts == 0
    assert all(
        nodes.nodes[f"{ctx.ownership.prefix}-tc{cid}-worker-{i}"].restarts == 1 for i in (1, 2, 3)
    )
    act(ctx, alice, world, cid, action="restart_cluster")
    operator.run(cid)
    assert nodes.nodes[f"{ctx.ownership.prefix}-tc{cid}-controller"].restarts == 1

    act(ctx, alice, world, cid, action="update_image", image_version_id=world["image2"])
    operator.run(cid)
    assert status(ctx, cid).status == "running"
    assert {n.spec.image for n in nodes.nodes.values()} == {"localhost/x:v2"}
    drained = [argv for _, argv in nodes.execs if "state=drain" in argv]
    resumed = [argv for _, argv in nodes.execs if "state=resume" in argv]
    assert len(drained) == len(resumed) == 3

    with ctx.transaction() as s:
        other = add_key(s, alice.account_id, "k2", KEY2, user_id=alice.user_id)
        other_id = other.id
    act(ctx, alice, world, cid, action="update_ssh_keys", ssh_key_ids=[other_id])
    operator.run(cid)
    assert all(
        "k2" in n.authorized_keys and "k1" not in n.authorized_keys for n in nodes.nodes.values()
    )


def edge_world(
    ctx: Context, alice: Principal, world: dict[str, Any], operator: TrainingOperator
) -> tuple[int, int, int, str, int]:
    """A running 1-worker cluster, a reserved IP (not attached) and a group allowing only
    127.0.0.2 (not attached): (cluster id, SSH port, IP id, address, group id)."""
    cid = create(ctx, alice, world, workers=1)
    operator.run(cid)
    ssh_port = status(ctx, cid).ssh_port
    assert ssh_port is not None
    ip = allocate_reserved_ip(ctx, alice, alice.default_project_id)
    with ctx.transaction() as s:
        group_id = create_group(
            s,
            alice.account_id,
            alice.default_project_id,
            name="only-2",
            description="",
            rules=[{"protocol": "tcp", "port_range": "22", "source_cidr": "127.0.0.2/32"}],
        ).id
    return cid, ssh_port, ip.id, ip.address, group_id


def until(check: Callable[[], bool], timeout_s: float = 30.0) -> None:
    """Poll ``check`` until it holds (fails the test after ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.02)


def test_a_removed_members_key_leaves_the_nodes_at_the_next_pass(
    ctx: Context,
    alice: Principal,
    world: dict[str, Any],
    operator: TrainingOperator,
    nodes: FakeNodeRuntime,
) -> None:
    """The cluster's SSH port reaches the controller's sshd directly: the nodes hold
    only the keys whose user may write to the project now, and the scan takes a
    removed member's key off every running node (and execs nothing when nothing
    changed)."""
    inv = members.create_invitation(
        ctx, alice, alice.account_id, "carol@example.com", "member", None
    )
    made = members.accept_invitation(ctx, inv.token, name=None, caller=None)
    with ctx.read() as s:
        carol = resolve_key(s, made["api_key"]["key"])
    with ctx.transaction() as s:
        carols = add_key(s, alice.account_id, "k2", KEY2, user_id=carol.user_id).id
        nobodys = add_key(s, alice.account_id, "k3", KEY2.replace(" k2", " k3")).id
    cid = training.create_cluster(
        ctx,
        alice,
        world["scope"],
        {
            "name": "t",
            "image_version_id": world["image"],
            "ssh_key_ids": [world["key"], carols, nobodys],
            "no_of_nodes": 1,
            "gpu_type": A,
            "gpus_per_node": 1,
            "cpus_per_node": 2,
            "memory_gb_per_node": 4,
        },
    )
    operator.run(cid)
    assert status(ctx, cid).status == "running"
    # A key with no user opens nothing.
    assert all(
        "k2" in n.authorized_keys and "k3" not in n.authorized_keys for n in nodes.nodes.values()
    )

    assert carol.member_id is not None
    members.remove_member(ctx, alice, alice.account_id, carol.member_id)
    operator.scan()
    until(lambda: all("k2" not in n.authorized_keys for n in nodes.nodes.values()))
    assert all(KEY in n.authorized_keys for n in nodes.nodes.values())

    # Nothing changed since: no node is written again.
    for n in nodes.nodes.values():
        n.authorized_keys = "untouched"
    with ctx.read() as s:
        assert operator.node_keys.scan(s) == []
    operator.node_keys.refresh(cid)
    assert {n.authorized_keys for n in nodes.nodes.values()} == {"untouched"}


def test_edge_follows_reserved_ips_and_security_groups(
    ctx: Context,
    alice: Principal,
    world: dict[str, Any],
    operator: TrainingOperator,
    edge: FakeEdge,
) -> None:
    cid, ssh_port, ip_id, address, group_id = edge_world(ctx, alice, world, operator)
    act(ctx, alice, world, cid, action="attach_ip", reserved_ip_id=ip_id)
    operator.sync_edge(cid)
    assert set(edge.listeners) == {("0.0.0.0", ssh_port), (address, 22)}
    act(ctx, alice, world, cid, action="add_security_group", security_groups_ids=[group_id])
    operator.sync_edge(cid)
    _, _, acl = edge.listeners[(address, 22)]
    assert acl("127.0.0.2", 22) and not acl("127.0.0.3", 22)
    act(ctx, alice, world, cid, action="remove_security_group", security_group_id=group_id)
    operator.sync_edge(cid)
    assert acl("127.0.0.3", 22)
    act(ctx, alice, world, cid, action="detach_ip", reserved_ip_id=ip_id, ip_type="public")
    operator.sync_edge(cid)
    assert set(edge.listeners) == {("0.0.0.0", ssh_port)}


def test_edge_changes_apply_while_the_engine_is_down_and_the_scan_heals(
    ctx: Context,
    alice: Principal,
    world: dict[str, Any],
    operator: TrainingOperator,
    nodes: FakeNodeRuntime,
    edge: FakeEdge,
) -> None:
    cid, ssh_port, ip_id, address, group_id = edge_world(ctx, alice, world, operator)
    act(ctx, alice, world, cid, action="attach_ip", reserved_ip_id=ip_id)
    operator.sync_edge(cid)
    _, _, acl = edge.listeners[(address, 22)]

    real_address = nodes.node_address

    def engine_down(name: str, network: str) -> str | None:
        raise RuntimeError("engine does not answer")

    nodes.node_address = engine_down  # type: ignore[method-assign]
    # A new group and a detach still take effect although the engine does not answer.
    act(ctx, alice, world, cid, action="add_security_group", security_groups_ids=[group_id])
    act(ctx, alice, world, cid, action="detach_ip", reserved_ip_id=ip_id, ip_type="public")
    operator.sync_edge(cid)
    assert not acl("127.0.0.3", 22) and acl("127.0.0.2", 22)
    assert set(edge.listeners) == {("0.0.0.0", ssh_port)}

    # A listener lost meanwhile comes back with the next scan once the engine answers.
    nodes.node_address = real_address  # type: ignore[method-assign]
    edge.applied.clear()  # the host's firewall was reloaded
    operator.scan()
    assert set(edge.listeners) == {("0.0.0.0", ssh_port)}

    # An attached group that vanished from the store closes the cluster (fail closed).
    with ctx.transaction() as s:
        s.execute(delete(SecurityGroup).where(SecurityGroup.id == group_id))
    operator.scan()
    _, _, acl = edge.listeners[("0.0.0.0", ssh_port)]
    assert not acl("127.0.0.2", 22) and not acl("127.0.0.3", 22)


def test_failure_shows_error_and_restart_cluster_recovers(
    ctx: Context,
    alice: Principal,
    world: dict[str, Any],
    operator: TrainingOperator,
    nodes: FakeNodeRuntime,
) -> None:
    cid = create(ctx, alice, world, workers=1)
    nodes.fail_create.add(f"{ctx.ownership.prefix}-tc{cid}-worker-1")
    operator.run(cid)
    c = status(ctx, cid)
    assert c.status == "error" and "injected failure" in (c.error_message or "")
    act(ctx, alice, world, cid, action="restart_cluster")
    operator.run(cid)
    assert status(ctx, cid).status == "running"
    assert nodes.node_state(f"{ctx.ownership.prefix}-tc{cid}-worker-1") == "running"


def failed_update_image(
    ctx: Context,
    alice: Principal,
    world: dict[str, Any],
    operator: TrainingOperator,
    nodes: FakeNodeRuntime,
) -> tuple[int, NodeName]:
    """A running cluster of two workers, worker 2 drained by its user, whose
    update_image drained worker 1 and then failed to replace it: ``error``."""
    cid = create(ctx, alice, world, workers=2)
    operator.run(cid)
    names = NodeName(cid, ctx.ownership.training_prefix(cid))
    user_drain = ["scontrol", "update", f"nodename={names.worker(2)}", "state=drain"]
    nodes.exec(names.controller, [*user_drain, "reason=user-maintenance"])
    act(ctx, alice, world, cid, action="update_image", image_version_id=world["image2"])
    nodes.fail_create.add(names.worker(1))
    operator.run(cid)
    c = status(ctx, cid)
    assert c.status == "error" and "injected failure" in (c.error_message or "")
    assert nodes.drained == {names.worker(1): "update_image", names.worker(2): "user-maintenance"}
    return cid, names


def test_restart_cluster_recovers_a_failed_update_image(
    ctx: Context,
    alice: Principal,
    world: dict[str, Any],
    operator: TrainingOperator,
    nodes: FakeNodeRuntime,
) -> None:
    """The replacement of a drained worker fails: the cluster shows the error, and
    restart_cluster brings the worker back into service (its drain undone), while a
    drain the user made stays."""
    cid, names = failed_update_image(ctx, alice, world, operator, nodes)
    nodes.fail_create.clear()
    act(ctx, alice, world, cid, action="restart_cluster")
    operator.run(cid)
    c = status(ctx, cid)
    assert c.status == "running", c.error_message
    assert nodes.node_state(names.worker(1)) == "running"
    assert nodes.drained == {names.worker(2): "user-maintenance"}
    # Every status change went through the funnel and left an event saying why.
    events = training.event_page(ctx, alice, world["scope"], cid, per_page=5000).events
    assert [(e.from_status, e.to_status) for e in events] == [
        (None, "creating"),
        ("creating", "running"),
        ("running", "updating"),
        ("updating", "error"),
        ("error", "restarting"),
        ("restarting", "running"),
    ]
    assert "injected failure" in events[3].message


def test_delete_after_a_half_built_cluster_leaves_nothing(
    ctx: Context,
    alice: Principal,
    world: dict[str, Any],
    nodes: FakeNodeRuntime,
    edge: FakeEdge,
) -> None:
    cid = create(ctx, alice, world, workers=2)
    # The first operator fails half-way (one worker up); the cluster shows the error.
    first = TrainingOperator(ctx, nodes, edge)
    nodes.fail_create.add(f"{ctx.ownership.prefix}-tc{cid}-worker-2")
    first.run(cid)
    assert status(ctx, cid).status == "error"
    assert nodes.node_state(f"{ctx.ownership.prefix}-tc{cid}-worker-1") == "running"

    training.delete_cluster(ctx, alice, world["scope"], cid)
    # Billing ends with the request, before (and however long) the teardown runs;
    # the GPUs stay held until the containers are gone.
    assert count(ctx, UsageInterval, UsageInterval.ended_at.is_(None)) == 0
    assert count(ctx, GpuAllocation) == 2
    second = TrainingOperator(ctx, nodes, edge)
    second.run(cid)
    assert nodes.nodes == {} and nodes.networks == set() and nodes.volumes == set()
    assert edge.listeners == {}
    assert count(ctx, GpuAllocation) == 0
    assert count(ctx, Reservation) == 0
    assert count(ctx, PortAllocation) == 0
    assert count(ctx, UsageInterval, UsageInterval.ended_at.is_(None)) == 0
    assert status(ctx, cid).deleted_at is not None
    with pytest.raises(training.TrainingClusterNotFound), ctx.read() as s:
        training.load_cluster(s, alice, world["scope"], cid)


def test_lifecycle_script_results_are_awaited_and_shown(
    ctx: Context,
    alice: Principal,
    world: dict[str, Any],
    nodes: FakeNodeRuntime,
    edge: FakeEdge,
) -> None:
    operator = TrainingOperator(ctx, nodes, edge, drain_timeout_s=0, lifecycle_timeout_s=0)
    cid = create(ctx, alice, world)
    names = NodeName(cid, ctx.ownership.training_prefix(cid))
    nodes.lifecycle_rc[names.worker(2)] = 100
    nodes.lifecycle_rc[names.controller] = None  # never finishes within the timeout
    operator.run(cid)
    c = status(ctx, cid)
    # The nodes work; the cluster runs and says where the script did not succeed.
    assert c.status == "running" and c.error_message is None
    assert f"{names.controller} (still running after 0 s)" in c.status_reason
    assert f"{names.worker(2)} (exit 100)" in c.status_reason
    with ctx.read() as s:
        got = {
            n.name: (n.lifecycle_status, n.lifecycle_exit_code)
            for n in training_nodes.nodes_of(s, cid)
        }
    assert got == {
        names.controller: ("timed_out", None),
        names.worker(1): ("succeeded", 0),
        names.worker(2): ("failed", 100),
    }

    # A new worker runs the script once; the others are not waited for again.
    act(ctx, alice, world, cid, action="scale_cluster", additional_nodes=1)
    operator.run(cid)
    c = status(ctx, cid)
    assert c.status == "running" and c.status_reason == "scale_cluster done"
    with ctx.read() as s:
        new = next(n for n in training_nodes.nodes_of(s, cid) if n.name == names.worker(3))
        assert (new.lifecycle_status, new.lifecycle_exit_code) == ("succeeded", 0)


def test_lifecycle_wait_is_cut_short_by_a_delete(
    ctx: Context,
    alice: Principal,
    world: dict[str, Any],
    nodes: FakeNodeRuntime,
    edge: FakeEdge,
) -> None:
    """A script that never ends does not keep a delete waiting for the timeout."""
    operator = TrainingOperator(ctx, nodes, edge, drain_timeout_s=0, lifecycle_timeout_s=600)
    cid = create(ctx, alice, world, workers=1)
    nodes.lifecycle_rc[NodeName(cid, ctx.ownership.training_prefix(cid)).worker(1)] = None
    polls = 0
    real = nodes.lifecycle_result

    def result_then_delete(name: str) -> int | None:
        nonlocal polls
        polls += 1
        if polls == 2:
            training.delete_cluster(ctx, alice, world["scope"], cid)
        return real(name)

    nodes.lifecycle_result = result_then_delete  # type: ignore[method-assign]
    operator.run(cid)  # returns once superseded, well before 600 s
    operator.run(cid)  # the delete
    assert nodes.nodes == {}
    assert count(ctx, GpuAllocation) == 0


def open_intervals(ctx: Context) -> int:
    return count(ctx, UsageInterval, UsageInterval.ended_at.is_(None))


def test_a_stop_unbills_and_frees_every_node_and_restart_cluster_starts_it_again(
    ctx: Context,
    alice: Principal,
    world: dict[str, Any],
    operator: TrainingOperator,
    nodes: FakeNodeRuntime,
    clock: FakeClock,
) -> None:
    cid = create(ctx, alice, world)
    operator.run(cid)
    assert status(ctx, cid).status == "running"
    names = NodeName(cid, status(ctx, cid).name_prefix)
    assert open_intervals(ctx) > 0 and count(ctx, GpuAllocation) == 2

    clock.advance(60)
    assert training_stops.stop_cluster(ctx, cid, "account suspended: unpaid")
    # Billing ends at the stop; the GPUs stay held while the node containers may run.
    c = status(ctx, cid)
    assert c.status == "stopping" and c.status_reason == "account suspended: unpaid"
    assert open_intervals(ctx) == 0 and count(ctx, GpuAllocation) == 2
    with pytest.raises(InsufficientCapacity):
        create(ctx, alice, world, workers=4)  # not on GPUs a stopping node may use
    assert not training_stops.stop_cluster(ctx, cid, "again")  # stopping already: no-op
    operator.run(cid)
    assert count(ctx, GpuAllocation) == 0 and count(ctx, Reservation) == 0
    c = status(ctx, cid)
    assert c.status == "stopped" and c.operation is None
    assert c.status_reason == "account suspended: unpaid"
    assert nodes.nodes == {}
    assert names.state_volume in nodes.volumes  # the Slurm queue is kept
    with ctx.read() as s:
        stopped_nodes = training_nodes.nodes_of(s, cid)
    assert {n.status for n in stopped_nodes} == {"stopped"}
    assert all(n.gpu_indices == [] for n in stopped_nodes)
    view = training_reads.show_cluster(ctx, alice, world["scope"], cid, None)
    assert view["allowed_actions"] == ["restart_cluster", "update_auto_terminate"]
    with pytest.raises(InvalidState):
        act(ctx, alice, world, cid, action="restart_workers")

    clock.advance(60)
    wiped = list(nodes.removed_volumes)
    # An update_image the stop cut short: the cluster names the new image, no node runs it.
    with ctx.transaction() as s:
        row = s.get(TrainingCluster, cid)
        assert row is not None
        row.image_version_id = world["image2"]
    act(ctx, alice, world, cid, action="restart_cluster")
    assert status(ctx, cid).status == "restarting"
    assert count(ctx, GpuAllocation) == 2 and open_intervals(ctx) > 0
    operator.run(cid)
    c = status(ctx, cid)
    assert c.status == "running", c.error_message
    assert len(nodes.nodes) == 3
    with ctx.read() as s:
        assert {n.image_version_id for n in training_nodes.nodes_of(s, cid)} == {world["image2"]}
    # The queue survived: the start did not wipe the controller's state volume.
    assert nodes.removed_volumes == wiped and names.state_volume in nodes.volumes


def test_a_start_after_a_stop_resumes_the_workers_an_update_image_left_drained(
    ctx: Context,
    alice: Principal,
    world: dict[str, Any],
    operator: TrainingOperator,
    nodes: FakeNodeRuntime,
) -> None:
    """An update_image drained worker 1 and failed replacing it; the cluster is then
    stopped (its account suspended, say) and started again: the kept Slurm state still
    marks worker 1 drained, and the start resumes it. A drain the user made stays."""
    cid, names = failed_update_image(ctx, alice, world, operator, nodes)
    assert training_stops.stop_cluster(ctx, cid, "account suspended")
    operator.run(cid)
    assert status(ctx, cid).status == "stopped" and nodes.nodes == {}
    nodes.fail_create.clear()
    act(ctx, alice, world, cid, action="restart_cluster")
    operator.run(cid)
    c = status(ctx, cid)
    assert c.status == "running", c.error_message
    assert nodes.drained == {names.worker(2): "user-maintenance"}


def test_a_stop_supersedes_a_running_create(
    ctx: Context,
    alice: Principal,
    world: dict[str, Any],
    operator: TrainingOperator,
    nodes: FakeNodeRuntime,
) -> None:
    cid = create(ctx, alice, world)
    token = (status(ctx, cid).operation or {})["token"]
    assert training_stops.stop_cluster(ctx, cid, "budget exhausted")
    with pytest.raises(Superseded):
        operator.check(cid, token)  # the create's job stops at its next step
    operator.run(cid)
    assert status(ctx, cid).status == "stopped"
    assert nodes.nodes == {} and count(ctx, GpuAllocation) == 0


def test_a_start_that_does_not_fit_leaves_it_stopped(
    ctx: Context,
    alice: Principal,
    world: dict[str, Any],
    operator: TrainingOperator,
) -> None:
    cid = create(ctx, alice, world)
    operator.run(cid)
    training_stops.stop_cluster(ctx, cid, "account suspended")
    operator.run(cid)
    # Another cluster takes the host's four A6000s meanwhile.
    assert count(ctx, GpuAllocation) == 0
    other = create(ctx, alice, world, workers=4)
    with pytest.raises(InsufficientCapacity):
        act(ctx, alice, world, cid, action="restart_cluster")
    c = status(ctx, cid)
    assert c.status == "stopped" and c.operation is None
    assert count(ctx, GpuAllocation) == 4
    training.delete_cluster(ctx, alice, world["scope"], other)
    operator.run(other)
    act(ctx, alice, world, cid, action="restart_cluster")
    operator.run(cid)
    assert status(ctx, cid).status == "running"


def test_suspension_and_a_spent_budget_stop_training_clusters_and_refuse_new_ones(
    ctx: Context,
    alice: Principal,
    world: dict[str, Any],
    operator: TrainingOperator,
    clock: FakeClock,
) -> None:
    op = dataclasses.replace(alice, operator=True, scope=Scope.ADMIN)
    cid = create(ctx, alice, world)
    operator.run(cid)

    accounts.update_account(ctx, op, alice.account_id, name=None, status="suspended", reason="kyc")
    c = status(ctx, cid)
    assert c.status == "stopping" and c.status_reason == "account suspended: kyc"
    operator.run(cid)
    assert status(ctx, cid).status == "stopped"
    with pytest.raises(AccountSuspended):
        create(ctx, alice, world)
    with pytest.raises(AccountSuspended):
        act(ctx, alice, world, cid, action="restart_cluster")
    assert status(ctx, cid).status == "stopped" and count(ctx, GpuAllocation) == 0
    accounts.update_account(ctx, op, alice.account_id, name=None, status="active", reason=None)
    act(ctx, alice, world, cid, action="restart_cluster")
    operator.run(cid)
    assert status(ctx, cid).status == "running"

    # A prepaid balance of one minute of the nodes' spend: stopped at the crossing.
    budgets.update_budget(
        ctx,
        op,
        alice.account_id,
        budgets.BudgetChange(fields=frozenset({"billing_mode"}), billing_mode="prepaid"),
    )
    with ctx.read() as s:
        rate = budgets.spend_rate_micro(s, alice.account_id)
    assert rate > 0
    budgets.add_credit(ctx, op, alice.account_id, rate // 60 + 1, "a minute")
    assert budgets.enforce_budget(ctx, alice.account_id).stopped == []
    clock.advance(61)
    check = budgets.enforce_budget(ctx, alice.account_id)
    assert check.exhausted and check.stopped == [f"tc-{cid}"]
    assert "budget exhausted" in status(ctx, cid).status_reason
    operator.run(cid)
    assert status(ctx, cid).status == "stopped"
    with pytest.raises(BudgetExhausted):
        create(ctx, alice, world)
    with pytest.raises(BudgetExhausted):
        act(ctx, alice, world, cid, action="restart_cluster")
    with ctx.read() as s:
        assert budgets.spend_rate_micro(s, alice.account_id) == 0


def test_a_stopped_cluster_counts_against_no_quota(
    ctx: Context, alice: Principal, world: dict[str, Any], operator: TrainingOperator
) -> None:
    cid = create(ctx, alice, world)
    operator.run(cid)
    with ctx.read() as s:
        assert quotas.usage_of(s, alice.account_id, None).gpus_by_type == {A: 2}
    training_stops.stop_cluster(ctx, cid, "account suspended")
    with ctx.read() as s:
        held = quotas.usage_of(s, alice.account_id, None)
    assert held.gpus_by_type == {} and held.running_clusters == 0


def test_the_edge_and_the_ssh_command_follow_the_controllers_host(
    ctx: Context,
    alice: Principal,
    world: dict[str, Any],
    nodes: FakeNodeRuntime,
) -> None:
    """SSH is served on the host the controller runs on: its rules go there (and leave
    the host it ran on before), and the connection string names that host's address,
    not this server's public address."""
    ctx.settings.public_address = "203.0.113.1"
    edges: dict[int | None, FakeEdge] = {}

    def edge_on(host_id: int | None) -> FakeEdge:
        return edges.setdefault(host_id, FakeEdge())

    operator = TrainingOperator(ctx, nodes, edge_on, drain_timeout_s=0)
    cid = create(ctx, alice, world, workers=1)
    operator.run(cid)
    first = status(ctx, cid).host_id
    assert set(edges[first].applied) == {cid}

    far = add_host_row(ctx, "far")
    with ctx.transaction() as s:
        controller = s.scalars(
            select(TrainingNode).where(
                TrainingNode.cluster_id == cid, TrainingNode.role == "controller"
            )
        ).one()
        controller.host_id = far
    operator.sync_edge(cid)
    assert edges[first].applied == {} and set(edges[far].applied) == {cid}
    view = training_reads.show_cluster(ctx, alice, world["scope"], cid, None)
    port = view["ssh"]["port"]
    assert view["ssh"]["host"] == "far.example"
    assert view["ssh"]["command"] == f"ssh -p {port} root@far.example"

    # After a restart nobody remembers where the rules were: the scan's sweep removes
    # those on a host the controller left, and those of a cluster that is gone.
    edges[first].apply(dataclasses.replace(edges[far].applied[cid]))
    edges[first].apply(dataclasses.replace(edges[far].applied[cid], cluster_id=4242))
    restarted = TrainingOperator(ctx, nodes, edge_on, drain_timeout_s=0)
    restarted.scan()
    assert edges[first].applied == {} and set(edges[far].applied) == {cid}

    training.delete_cluster(ctx, alice, world["scope"], cid)
    operator.run(cid)
    assert all(edge.applied == {} for edge in edges.values())
