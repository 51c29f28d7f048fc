"""What a failed container printed (and what the engine said about the user's image and
command) stays with the cluster — its error_message and events — and never reaches the
server log, which gets the cluster id and the kind of failure with its exit code.

Fake runtimes whose containers print a secret; real database; the server log is
pytest's caplog (every record of every gpuyard logger)."""

from __future__ import annotations

import logging

import pytest
from sqlalchemy import select

from gpuyard.core.errors import RuntimeFailure
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

SECRET = "hunter2-db-password"


class DiesAtStart(FakeRuntime):
    """Every container prints the secret and exits with code 2 as soon as it starts."""

    def start(self, cluster_id: str) -> None:
        super().start(cluster_id)
        self.containers[cluster_id].log_lines.append(f"connecting with password={SECRET}")
        self.crash(cluster_id, exit_code=2)


def events(ctx: Context, cid: str) -> str:
    with ctx.read() as s:
        return "\n".join(s.scalars(select(Event.message).where(Event.cluster_id == cid)))


def server_log(caplog: pytest.LogCaptureFixture) -> str:
    return "\n".join(r.getMessage() for r in caplog.records)


def test_exit_during_startup(
    ctx: Context, alice: Principal, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="gpuyard")
    rec = build_reconciler(ctx, DiesAtStart())
    c = uc.create_cluster(ctx, alice, a6000(1))
    settle(rec, c.id)
    got = uc.get_cluster(ctx, alice, c.id)
    assert got.status == "error"
    assert SECRET in (got.error_message or "") and SECRET in events(ctx, c.id)
    log = server_log(caplog)
    assert f"cluster {c.id} failed: container exited with code 2 during startup" in log
    assert SECRET not in log


class RefusesStart(FakeRuntime):
    """The engine refuses every start, naming the user's command (and its secret)."""

    def start(self, cluster_id: str) -> None:
        self.calls["start"] = self.calls.get("start", 0) + 1
        raise RuntimeFailure(f'exec: "serve --token {SECRET}": not found')


def test_engine_refusing_the_start(
    ctx: Context, alice: Principal, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="gpuyard")
    runtime = RefusesStart()
    rec = build_reconciler(ctx, runtime)
    c = uc.create_cluster(ctx, alice, a6000(1))
    for _ in range(5):  # past each attempt's back-off (reconciler/clusters/start_retries.py)
        rec.driver.drive(c.id)
        clock.advance(5)
    got = uc.get_cluster(ctx, alice, c.id)
    assert got.status == "error" and SECRET in (got.error_message or "")
    assert runtime.calls["start"] == 3
    assert "start attempt 2 of 3 failed" in events(ctx, c.id)
    log = server_log(caplog)
    assert f"cluster {c.id}: start attempt 1 failed (RUNTIME_ERROR); trying again" in log
    assert f"cluster {c.id} failed: start failed (RUNTIME_ERROR)" in log
    assert SECRET not in log


def test_giving_up_after_restarts_and_a_failed_restart(
    ctx: Context,
    alice: Principal,
    rec: Reconciler,
    runtime: FakeRuntime,
    clock: FakeClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="gpuyard")
    c = uc.create_cluster(ctx, alice, a6000(1))
    settle(rec, c.id)
    # A restart the engine refuses, naming the user's command.
    clock.advance(1)
    runtime.crash(c.id, exit_code=7)
    rec.driver.recover(c.id)
    clock.advance(1.1)
    runtime.fail_next["create"] = f"cannot create: bad arg --password={SECRET}"
    rec.driver.recover(c.id)
    assert f"restart 1 failed: cannot create: bad arg --password={SECRET}" in events(ctx, c.id)
    # Then it keeps dying, printing the secret, until the policy gives up (5 failures
    # within 10 minutes).
    for _ in range(30):
        with ctx.read() as s:
            row = s.get(Cluster, c.id)
            assert row is not None
            status, due = row.status, row.next_restart_at
        if status == "error":
            break
        if due is not None:
            clock.advance(max(0.0, (due - clock.now()).total_seconds()) + 0.01)
        elif runtime.containers[c.id].state == ContainerState.RUNNING:
            runtime.containers[c.id].log_lines.append(f"password={SECRET}")
            runtime.crash(c.id, exit_code=7)
        rec.driver.recover(c.id)
    got = uc.get_cluster(ctx, alice, c.id)
    assert got.status == "error", got
    assert SECRET in (got.error_message or "") and SECRET in events(ctx, c.id)
    log = server_log(caplog)
    assert f"restart 1 of cluster {c.id} failed (RUNTIME_ERROR)" in log
    assert f"cluster {c.id} failed: container exited (code 7); gave up after" in log
    assert SECRET not in log


class ReplacedOnceAtStart(FakeRuntime):
    """The first container is removed right after it starts, as when another replica
    that took the host's lease re-makes it: observed as missing, never as exited."""

    def __init__(self) -> None:
        super().__init__()
        self.replaced = False

    def start(self, cluster_id: str) -> None:
        super().start(cluster_id)
        if not self.replaced:
            self.replaced = True
            del self.containers[cluster_id]


def test_a_container_removed_while_starting_is_started_again(
    ctx: Context, alice: Principal
) -> None:
    runtime = ReplacedOnceAtStart()
    rec = build_reconciler(ctx, runtime)
    c = uc.create_cluster(ctx, alice, a6000(1))
    settle(rec, c.id)
    got = uc.get_cluster(ctx, alice, c.id)
    assert runtime.replaced and got.status == "running", got.error_message
    assert runtime.observe(c.id).state == ContainerState.RUNNING
    assert gpus_held(ctx, c.id) == [0]
