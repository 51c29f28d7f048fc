"""Desired state wins: a running cluster whose container dies is brought back with
back-off, keeping its GPUs; after the limit it goes to error and keeps its container.
Fake runtime, real database, injected clock."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

from sqlalchemy import select

from gpuyard.reconciler.loop import Reconciler
from gpuyard.reconciler.wiring import build_reconciler
from gpuyard.runtimes.base import ContainerState
from gpuyard.services.clock import FakeClock
from gpuyard.services.clusters import use_cases as uc
from gpuyard.services.context import Context
from gpuyard.services.tenancy.auth import Principal
from gpuyard.store.schema import Cluster, Event
from gpuyard.testing.fake_runtime import FakeRuntime
from tests.service.test_lifecycle import a6000, gpus_held, settle


def _events(ctx: Context, cid: str) -> list[str]:
    with ctx.read() as s:
        return list(s.scalars(select(Event.message).where(Event.cluster_id == cid)))


def _row(ctx: Context, cid: str) -> Cluster:
    with ctx.read() as s:
        row = s.get(Cluster, cid)
        assert row is not None
        s.expunge(row)
        return row


def test_dead_container_is_recreated_after_backoff_keeping_gpus(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime, clock: FakeClock
) -> None:
    c = uc.create_cluster(ctx, alice, a6000(2, volume_gb=5, env={"A": "1"}))
    settle(rec, c.id)
    runtime.write_file(c.id, "/workspace/ckpt", "epoch-3")
    first_container = runtime.containers[c.id].id
    clock.advance(1)
    runtime.crash(c.id, exit_code=3)

    rec.driver.recover(c.id)  # the failure is counted; the restart waits 1 s
    row = _row(ctx, c.id)
    assert row.status == "running" and row.last_exit_code == 3 and row.restarts == 0
    assert row.next_restart_at is not None
    assert runtime.containers[c.id].state == ContainerState.EXITED
    assert gpus_held(ctx, c.id) == [0, 1]

    clock.advance(0.5)
    rec.driver.recover(c.id)  # not yet due
    assert runtime.containers[c.id].state == ContainerState.EXITED
    clock.advance(0.6)
    rec.driver.recover(c.id)
    row = _row(ctx, c.id)
    assert row.restarts == 1 and row.last_restart_at is not None and row.next_restart_at is None
    container = runtime.containers[c.id]
    assert container.state == ContainerState.RUNNING and container.id != first_container
    assert container.spec.env["A"] == "1" and container.spec.gpu_indices == (0, 1)
    assert runtime.volume_files(ctx.ownership.volume(c.id)) == {"ckpt": "epoch-3"}
    assert gpus_held(ctx, c.id) == [0, 1]
    messages = _events(ctx, c.id)
    assert any("exited with code 3; restarting in 1 s" in m for m in messages)
    assert any("restarted (restart 1; last exit code 3)" in m for m in messages)
    view = uc.get_cluster(ctx, alice, c.id)
    assert view.restarts == 1 and view.last_exit_code == 3


def test_backoff_doubles_and_limit_ends_in_error_with_logs_and_container(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime, clock: FakeClock
) -> None:
    c = uc.create_cluster(ctx, alice, a6000(1))
    settle(rec, c.id)
    delays = []
    for attempt in range(4):
        clock.advance(1)
        runtime.containers[c.id].log_lines.append(f"boom {attempt}")
        runtime.crash(c.id, exit_code=7)
        rec.driver.recover(c.id)
        row = _row(ctx, c.id)
        assert row.next_restart_at is not None
        delays.append((row.next_restart_at - clock.now()).total_seconds())
        clock.advance(delays[-1])
        rec.driver.recover(c.id)
        assert runtime.containers[c.id].state == ContainerState.RUNNING
    assert delays == [1, 2, 4, 8]
    clock.advance(1)
    runtime.containers[c.id].log_lines.append("final words")
    runtime.crash(c.id, exit_code=7)
    rec.driver.recover(c.id)  # the 5th failure within 10 minutes
    got = uc.get_cluster(ctx, alice, c.id)
    assert got.status == "error"
    assert "exited with code 7" in (got.error_message or "")
    assert "final words" in (got.error_message or "")
    assert gpus_held(ctx, c.id) == []
    # The stopped container is kept so its logs can be read.
    assert c.id in runtime.containers
    assert runtime.containers[c.id].state == ContainerState.EXITED
    rec.observe()
    rec.wait_idle(timeout=10)
    assert c.id in runtime.containers


def test_failures_outside_the_window_do_not_count(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime, clock: FakeClock
) -> None:
    c = uc.create_cluster(ctx, alice, a6000(1))
    settle(rec, c.id)
    for _ in range(8):
        clock.advance(timedelta(minutes=11).total_seconds())
        runtime.crash(c.id, exit_code=1)
        rec.driver.recover(c.id)
        clock.advance(1)
        rec.driver.recover(c.id)
    row = _row(ctx, c.id)
    assert row.status == "running" and row.restarts == 8


def test_observe_pass_drives_recovery_end_to_end(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime, clock: FakeClock
) -> None:
    c = uc.create_cluster(ctx, alice, a6000(1))
    settle(rec, c.id)
    clock.advance(1)
    runtime.stop(c.id)  # the container vanished (engine restart, someone removed it)
    rec.observe()
    rec.wait_idle(timeout=10)
    clock.advance(1)
    rec.run_pass(observe=False)
    rec.wait_idle(timeout=10)
    rec.stop()
    row = _row(ctx, c.id)
    assert row.restarts == 1 and row.status == "running"
    assert runtime.containers[c.id].state == ContainerState.RUNNING
    assert any("container disappeared" in m for m in _events(ctx, c.id))


def test_engine_that_does_not_answer_is_not_a_death(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime, clock: FakeClock
) -> None:
    c = uc.create_cluster(ctx, alice, a6000(1))
    settle(rec, c.id)
    clock.advance(1)
    runtime.unavailable = "engine restarting"
    rec.observe()
    rec.wait_idle(timeout=10)
    runtime.unavailable = None
    rec.stop()
    row = _row(ctx, c.id)
    assert row.status == "running" and row.restarts == 0 and row.last_exit_code is None
    assert gpus_held(ctx, c.id) == [0]


def test_a_stop_is_not_queued_behind_a_hanging_pull(
    ctx: Context, alice: Principal, runtime: FakeRuntime
) -> None:
    ctx.settings.reconcile_workers = 1  # one worker per lane: lanes, not luck
    rec = build_reconciler(ctx, runtime)
    b = uc.create_cluster(ctx, alice, a6000(1))
    settle(rec, b.id)
    assert uc.get_cluster(ctx, alice, b.id).status == "running"
    gate = threading.Event()
    runtime.pull_gate = gate
    slow = uc.create_cluster(ctx, alice, a6000(1, docker_image="ghcr.io/example/huge:1"))
    rec.run_pass(observe=False)  # the start of `slow` now hangs in its pull
    uc.stop_cluster(ctx, alice, b.id)
    deadline = time.monotonic() + 30  # the pull never ends: a stop behind it never would
    while uc.get_cluster(ctx, alice, b.id).status != "stopped":
        assert time.monotonic() < deadline, "the stop waited for the pull"
        rec.run_pass(observe=False)
        time.sleep(0.02)
    assert uc.get_cluster(ctx, alice, slow.id).status == "starting"
    gate.set()
    assert rec.wait_idle(timeout=10)
    rec.stop()
    assert uc.get_cluster(ctx, alice, slow.id).status == "running"
