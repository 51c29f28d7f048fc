"""Auto-termination of training clusters with an injected clock and a fake Slurm queue:
each rule fires at its deadline through the clusters' watcher, idle means no running
or pending job, and each firing is an event and (with a webhook) a delivery."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import select

from gpuyard.core.autoterm import Rule
from gpuyard.core.errors import InvalidState, ValidationFailed
from gpuyard.core.training.clusters import NodeName
from gpuyard.reconciler.duties.autoterminate import AutoTerminator
from gpuyard.reconciler.training.autoterm import TrainingAutoTerminator
from gpuyard.reconciler.training.operator import TrainingOperator
from gpuyard.reconciler.training.slurm_jobs import SQUEUE, SqueueJobs
from gpuyard.services.access.ssh_keys import add_key
from gpuyard.services.clock import FakeClock
from gpuyard.services.context import Context
from gpuyard.services.tenancy.auth import Principal
from gpuyard.services.training import reads as training_reads
from gpuyard.services.training import use_cases as training
from gpuyard.store.schema import (
    Account,
    AccountEvent,
    Event,
    ImageVersion,
    StartupSample,
    TrainingCluster,
    WebhookDelivery,
)
from gpuyard.testing.fake_nodes import FakeNodeRuntime
from gpuyard.testing.fake_runtime import FakeRuntime

A = "NVIDIA RTX A6000"
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGe4tciPtcKsqalQ5MYQNCKBAGbS1rO94qvBwyD7hpHy k1"


class Queue:
    """A controller's ``squeue -h -o %T`` output, per node name; ``None``: it fails."""

    def __init__(self) -> None:
        self.out: dict[str, str | None] = {}
        self.calls: list[tuple[str, list[str]]] = []

    def exec(self, name: str, argv: list[str], timeout_s: float = 30) -> tuple[int, str]:
        self.calls.append((name, argv))
        out = self.out.get(name, "")
        if out is None:
            return 1, "squeue: error: Unable to contact slurm controller"
        return 0, out


@pytest.fixture
def nodes() -> FakeNodeRuntime:
    return FakeNodeRuntime()


@pytest.fixture
def operator(ctx: Context, nodes: FakeNodeRuntime) -> TrainingOperator:
    return TrainingOperator(ctx, nodes, None, drain_timeout_s=0)


@pytest.fixture
def queue() -> Queue:
    return Queue()


@pytest.fixture
def watcher(ctx: Context, queue: Queue) -> AutoTerminator:
    """The clusters' watcher with the training side, as the server builds it."""
    return AutoTerminator(
        ctx,
        FakeRuntime(),
        gpu_utilization=lambda uuids: None,
        training=TrainingAutoTerminator(ctx, SqueueJobs(lambda host_id: queue)),
    )


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


def body(world: dict[str, Any], policy: dict[str, Any] | None, workers: int = 1) -> dict[str, Any]:
    b: dict[str, Any] = {
        "name": "t",
        "image_version_id": world["image"],
        "ssh_key_ids": [world["key"]],
        "no_of_nodes": workers,
        "gpu_type": A,
        "gpus_per_node": 1,
        "cpus_per_node": 2,
        "memory_gb_per_node": 4,
    }
    if policy is not None:
        b["auto_terminate"] = policy
    return b


def running(
    ctx: Context,
    alice: Principal,
    world: dict[str, Any],
    operator: TrainingOperator,
    policy: dict[str, Any] | None,
    workers: int = 1,
) -> int:
    cid = training.create_cluster(ctx, alice, world["scope"], body(world, policy, workers))
    operator.run(cid)
    assert row(ctx, cid).status == "running"
    return cid


def row(ctx: Context, cid: int) -> TrainingCluster:
    with ctx.read() as s:
        got = s.get(TrainingCluster, cid)
        assert got is not None
        s.expunge(got)
        return got


def view(ctx: Context, alice: Principal, world: dict[str, Any], cid: int) -> dict[str, Any]:
    return training_reads.show_cluster(ctx, alice, world["scope"], cid, None)


def events(ctx: Context, cid: int, type_: str = "auto_terminate") -> list[str]:
    with ctx.read() as s:
        return list(
            s.scalars(
                select(Event.message)
                .where(Event.cluster_id == f"tc-{cid}", Event.type == type_)
                .order_by(Event.id)
            )
        )


def controller(ctx: Context, cid: int) -> str:
    return NodeName(cid, row(ctx, cid).name_prefix).controller


def test_max_runtime_stops_the_cluster_at_its_deadline(
    ctx: Context,
    alice: Principal,
    world: dict[str, Any],
    operator: TrainingOperator,
    watcher: AutoTerminator,
    clock: FakeClock,
) -> None:
    with ctx.transaction() as s:
        account = s.get(Account, alice.account_id)
        assert account is not None
        account.webhook_url = "https://hooks.example.com/gpuyard"
    cid = running(ctx, alice, world, operator, {"max_runtime_hours": 1})
    shown = view(ctx, alice, world, cid)["auto_terminate"]
    assert shown["enabled"] is True and shown["action"] == "stop"
    assert shown["max_runtime_hours"] == 1 and shown["next_rule"] == "max_runtime"
    assert shown["seconds_left"] == pytest.approx(3600)  # the countdown
    clock.advance(3599)
    assert watcher.run() == []
    assert watcher.seconds_until_next() == pytest.approx(1.0)
    assert view(ctx, alice, world, cid)["auto_terminate"]["seconds_left"] == pytest.approx(1.0)
    clock.advance(1.5)
    fired = watcher.run()
    assert [(f.cluster_id, f.rule) for f in fired] == [(f"tc-{cid}", Rule.MAX_RUNTIME)]
    c = row(ctx, cid)
    assert c.status == "stopping"
    assert c.status_reason.startswith("auto-stopped: max runtime 1 h reached at 1.0001 h")
    assert events(ctx, cid)[-1].startswith("rule max_runtime due at")
    operator.run(cid)
    assert row(ctx, cid).status == "stopped"
    assert watcher.run() == [] and watcher.seconds_until_next() is None
    # The account hears of it: an account event, and a delivery to its webhook.
    with ctx.read() as s:
        event = s.scalars(
            select(AccountEvent).where(AccountEvent.kind == "training.auto_terminated")
        ).one()
        assert event.detail["training_cluster_id"] == cid
        assert event.detail["rule"] == "max_runtime" and event.detail["action"] == "stop"
        delivery = s.scalars(select(WebhookDelivery)).one()
        assert delivery.event_id == event.id and '"training.auto_terminated"' in delivery.body


def test_a_restart_from_stopped_is_a_new_run(
    ctx: Context,
    alice: Principal,
    world: dict[str, Any],
    operator: TrainingOperator,
    watcher: AutoTerminator,
    clock: FakeClock,
) -> None:
    cid = running(ctx, alice, world, operator, {"max_runtime_hours": 1})
    clock.advance(3601)
    assert len(watcher.run()) == 1
    operator.run(cid)
    clock.advance(7200)
    training.perform_action(ctx, alice, world["scope"], cid, {"action": "restart_cluster"})
    operator.run(cid)
    assert row(ctx, cid).status == "running"
    # The runtime counts from the start again, not from the create.
    assert watcher.run() == []
    assert watcher.seconds_until_next() == pytest.approx(3600)


def test_cost_limit_counts_what_the_run_billed_also_across_a_scale(
    ctx: Context,
    alice: Principal,
    world: dict[str, Any],
    operator: TrainingOperator,
    watcher: AutoTerminator,
    clock: FakeClock,
) -> None:
    cid = running(ctx, alice, world, operator, {"cost_limit_usd": 2.0, "action": "delete"})
    rate1 = view(ctx, alice, world, cid)["price_per_hour"]
    watcher.run()
    first = watcher.seconds_until_next()
    assert first == pytest.approx(2.0 / rate1 * 3600, abs=2)
    # An hour in, a second worker: the rest of the limit goes at the new rate.
    clock.advance(3600)
    training.perform_action(
        ctx, alice, world["scope"], cid, {"action": "scale_cluster", "additional_nodes": 1}
    )
    operator.run(cid)
    rate2 = view(ctx, alice, world, cid)["price_per_hour"]
    assert rate2 > rate1
    watcher.run()
    left = watcher.seconds_until_next()
    assert left == pytest.approx((2.0 - rate1) / rate2 * 3600, abs=2)
    assert left is not None
    clock.advance(left - 2)
    assert watcher.run() == []
    clock.advance(3)
    assert [f.rule for f in watcher.run()] == [Rule.COST_LIMIT]
    c = row(ctx, cid)
    assert c.status == "deleting"
    assert c.status_reason.startswith("auto-deleted: cost limit 2.00 USD reached at 2.0")
    operator.run(cid)
    assert row(ctx, cid).deleted_at is not None


def test_idle_counts_from_the_last_job_and_a_pending_job_is_not_idle(
    ctx: Context,
    alice: Principal,
    world: dict[str, Any],
    operator: TrainingOperator,
    watcher: AutoTerminator,
    queue: Queue,
    clock: FakeClock,
) -> None:
    cid = running(ctx, alice, world, operator, {"idle_minutes": 10})
    name = controller(ctx, cid)
    started = clock.now()
    assert watcher.run(sample=True) == []
    assert queue.calls[-1] == (name, SQUEUE)
    shown = view(ctx, alice, world, cid)["auto_terminate"]
    assert shown["idle_since"] == started.isoformat().replace("+00:00", "Z")
    assert shown["next_rule"] == "idle" and shown["seconds_left"] == pytest.approx(600)
    # Nine minutes with no job, then one waits for nodes: not idle.
    clock.advance(540)
    queue.out[name] = "PENDING\n"
    assert watcher.run(sample=True) == []
    assert view(ctx, alice, world, cid)["auto_terminate"]["next_deadline_at"] is None
    clock.advance(1200)
    assert watcher.run(sample=True) == []  # still pending after 29 minutes
    queue.out[name] = "RUNNING\nPENDING\n"
    clock.advance(60)
    assert watcher.run(sample=True) == []
    last_job = clock.now()
    # The queue empties (a suspended job is no work): ten minutes from the last job.
    queue.out[name] = "SUSPENDED\n"
    clock.advance(30)
    assert watcher.run(sample=True) == []
    assert watcher.seconds_until_next() == pytest.approx(570)
    clock.advance(569)
    assert watcher.run(sample=True) == []
    clock.advance(1.5)
    assert [f.rule for f in watcher.run(sample=False)] == [Rule.IDLE]
    c = row(ctx, cid)
    assert c.status == "stopping"
    assert c.status_reason == ("auto-stopped: idle for 10 min (no running or pending Slurm job)"), (
        last_job
    )


def test_a_queue_that_cannot_be_read_counts_as_busy_and_is_reported_once(
    ctx: Context,
    alice: Principal,
    world: dict[str, Any],
    operator: TrainingOperator,
    watcher: AutoTerminator,
    queue: Queue,
    clock: FakeClock,
) -> None:
    cid = running(ctx, alice, world, operator, {"idle_minutes": 1})
    queue.out[controller(ctx, cid)] = None
    for _ in range(3):
        clock.advance(120)
        assert watcher.run(sample=True) == []
    assert row(ctx, cid).status == "running"
    failed = [m for m in events(ctx, cid) if m.startswith("idle sample failed")]
    assert len(failed) == 1 and "squeue" in failed[0]
    queue.out[controller(ctx, cid)] = ""
    watcher.run(sample=True)
    clock.advance(61)
    assert [f.rule for f in watcher.run(sample=False)] == [Rule.IDLE]


def test_the_policy_changes_by_action_and_a_passed_limit_fires_next_pass(
    ctx: Context,
    alice: Principal,
    world: dict[str, Any],
    operator: TrainingOperator,
    watcher: AutoTerminator,
    clock: FakeClock,
) -> None:
    cid = running(ctx, alice, world, operator, None)
    assert view(ctx, alice, world, cid)["auto_terminate"] == {
        "enabled": False,
        "error": None,
        "run_started_at": clock.now().isoformat().replace("+00:00", "Z"),
        "idle_since": None,
        "next_deadline_at": None,
        "next_rule": None,
        "next_action": None,
        "seconds_left": None,
    }
    clock.advance(7200)
    assert watcher.run() == []

    def update(policy: Any) -> dict[str, Any]:
        return training.perform_action(
            ctx,
            alice,
            world["scope"],
            cid,
            {"action": "update_auto_terminate", "auto_terminate": policy},
        ).__dict__

    # The clusters' bounds and messages; nothing changes on a refusal.
    for bad, field in (
        ({"idle_minutes": 0}, "auto_terminate.idle_minutes"),
        ({"max_runtime_hours": 9000}, "auto_terminate.max_runtime_hours"),
        ({"action": "terminate"}, "auto_terminate.action"),
        ({"cost_limit_usd": "5"}, "auto_terminate.cost_limit_usd"),
        ({"shutdown": True}, "auto_terminate.shutdown"),
        ([1], "auto_terminate"),
    ):
        with pytest.raises(ValidationFailed) as err:
            update(bad)
        assert err.value.field == field, err.value
    with pytest.raises(ValidationFailed, match="at most 8,760"):
        update({"max_runtime_hours": 9000})
    assert row(ctx, cid).auto_terminate == {}

    update({"max_runtime_hours": 1, "action": "delete"})
    stored = row(ctx, cid).auto_terminate
    assert stored["max_runtime_hours"] == 1 and stored["action"] == "delete"
    assert stored["enabled"] is True
    assert events(ctx, cid)[-1] == "policy updated: action, max_runtime_hours"
    # Two hours into the run, a one-hour limit: fires on the next pass.
    fired = watcher.run()
    assert [f.rule for f in fired] == [Rule.MAX_RUNTIME]
    assert row(ctx, cid).status == "deleting"
    with pytest.raises(InvalidState):
        update({"idle_minutes": 5})


def test_a_policy_spent_before_the_nodes_run_is_refused_at_create(
    ctx: Context, alice: Principal, world: dict[str, Any]
) -> None:
    with ctx.transaction() as s:
        s.add(StartupSample(seconds=120.0))
    with pytest.raises(ValidationFailed, match="would be reached before the cluster is running"):
        training.create_cluster(
            ctx, alice, world["scope"], body(world, {"max_runtime_hours": 0.01})
        )
    with pytest.raises(ValidationFailed, match="greater than 0"):
        training.create_cluster(ctx, alice, world["scope"], body(world, {"idle_minutes": -1}))
    with ctx.read() as s:
        assert s.scalars(select(TrainingCluster)).all() == []
    cid = training.create_cluster(
        ctx, alice, world["scope"], body(world, {"max_runtime_hours": 1, "enabled": False})
    )
    assert row(ctx, cid).auto_terminate["enabled"] is False


def test_a_stored_policy_that_does_not_validate_is_reported_once_and_others_still_fire(
    ctx: Context,
    alice: Principal,
    world: dict[str, Any],
    operator: TrainingOperator,
    watcher: AutoTerminator,
    clock: FakeClock,
) -> None:
    bad = running(ctx, alice, world, operator, {"max_runtime_hours": 1})
    good = running(ctx, alice, world, operator, {"max_runtime_hours": 1})
    with ctx.transaction() as s:
        row_ = s.get(TrainingCluster, bad)
        assert row_ is not None
        row_.auto_terminate = {"enabled": True, "max_runtime_hours": 1e300, "action": "stop"}
        row_.version += 1
    clock.advance(3601)
    assert [f.cluster_id for f in watcher.run()] == [f"tc-{good}"]
    watcher.run()
    problems = [m for m in events(ctx, bad) if m.startswith("policy not enforced")]
    assert problems == ["policy not enforced: max_runtime_hours: must be a finite number "
                        "greater than 0 and at most 8,760 (hours)"]  # fmt: skip
    assert row(ctx, bad).status == "running"
    shown = view(ctx, alice, world, bad)["auto_terminate"]
    assert shown["error"] == problems[0].removeprefix("policy not enforced: ")
    assert shown["next_deadline_at"] is None


def test_a_new_holder_of_the_duty_starts_idle_windows_again(
    ctx: Context,
    alice: Principal,
    world: dict[str, Any],
    operator: TrainingOperator,
    watcher: AutoTerminator,
    clock: FakeClock,
) -> None:
    running(ctx, alice, world, operator, {"idle_minutes": 10})
    watcher.run(sample=True, fence=1)
    clock.advance(300)
    # Another replica held the duty in between: it may have seen jobs.
    assert watcher.run(sample=True, fence=2) == []
    assert watcher.seconds_until_next() == pytest.approx(600)
