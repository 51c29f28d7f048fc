"""Steady-state passes do no work for what did not change: auto-termination reads one
aggregate while the running clusters are as they were, the observe pass compares
nothing while the engine's listing and the clusters are as they were, and either
still acts on the first change (a new policy, a dead container, a cluster that should
no longer have its container). Fake runtime, real database, injected clock."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Engine, event, select, update

from gpuyard.core.autoterm import Rule
from gpuyard.reconciler.loop import Reconciler
from gpuyard.runtimes.base import ContainerState
from gpuyard.services.clock import FakeClock
from gpuyard.services.context import Context
from gpuyard.services.tenancy.auth import Principal
from gpuyard.store.schema import Cluster, Event
from gpuyard.testing.fake_runtime import FakeRuntime
from tests.service.test_autoterminate import running, terminator

# The observe pass's comparison reads these columns of every cluster that may have a
# container; the steady pass must not.
_COMPARE_READ = "SELECT clusters.id, clusters.status \nFROM clusters"


@contextmanager
def _selects(ctx: Context) -> Iterator[list[str]]:
    seen: list[str] = []
    bind = ctx.sessions.kw["bind"]
    assert isinstance(bind, Engine)

    def capture(_c: Any, _cur: Any, sql: str, _p: Any, _ctx: Any, _many: bool) -> None:
        if sql.lstrip().upper().startswith("SELECT"):
            seen.append(sql)

    event.listen(bind, "before_cursor_execute", capture)
    try:
        yield seen
    finally:
        event.remove(bind, "before_cursor_execute", capture)


def _events(ctx: Context, cid: str) -> list[str]:
    with ctx.read() as s:
        return list(s.scalars(select(Event.message).where(Event.cluster_id == cid)))


def test_an_unchanged_auto_termination_pass_reads_one_aggregate(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime, clock: FakeClock
) -> None:
    running(ctx, alice, rec, {"max_runtime_hours": 2})
    at = terminator(ctx, runtime)
    assert at.run() == []
    planned = at.next_due
    clock.advance(60)
    with _selects(ctx) as selects:
        assert at.run(sample=False) == []
    assert len(selects) == 1 and "count(" in selects[0].lower(), selects
    assert at.next_due == planned


def test_a_cluster_started_after_the_plan_is_watched_on_the_next_pass(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime, clock: FakeClock
) -> None:
    running(ctx, alice, rec, {"max_runtime_hours": 2})
    at = terminator(ctx, runtime)
    assert at.run() == [] and at.run() == []  # planned, then a pass that reads nothing
    soon = running(ctx, alice, rec, {"max_runtime_hours": 1})
    clock.advance(3601)
    fired = at.run()
    assert [(f.cluster_id, f.rule) for f in fired] == [(soon, Rule.MAX_RUNTIME)]


def test_an_unchanged_observe_pass_compares_nothing_and_a_death_is_still_recovered(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime, clock: FakeClock
) -> None:
    cid = running(ctx, alice, rec, {"max_runtime_hours": 2})
    clock.advance(1)
    with _selects(ctx) as first:
        rec.observe()
    with _selects(ctx) as second:
        rec.observe()
    assert any(s.startswith(_COMPARE_READ) for s in first), first
    assert not any(s.startswith(_COMPARE_READ) for s in second), second

    runtime.crash(cid, exit_code=9)
    rec.observe()  # the listing changed: compared again, the death seen in this pass
    assert rec.wait_idle(timeout=10)
    rec.stop()
    with ctx.read() as s:
        row = s.get(Cluster, cid)
        assert row is not None and row.status == "running" and row.last_exit_code == 9
    assert any("container exited with code 9" in m for m in _events(ctx, cid))


def test_a_cluster_that_stops_wanting_its_container_is_seen_with_the_engine_unchanged(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime, clock: FakeClock
) -> None:
    cid = running(ctx, alice, rec, {"max_runtime_hours": 2})
    rec.observe()
    rec.observe()  # steady: nothing compared
    clock.advance(1)
    with ctx.transaction() as s:
        # Written as the status funnel writes (version and updated_at), the container
        # left behind (a crash between the status change and the stop).
        s.execute(
            update(Cluster)
            .where(Cluster.id == cid)
            .values(status="stopped", version=Cluster.version + 1, updated_at=clock.now())
        )
    rec.observe()
    assert rec.wait_idle(timeout=10)
    assert runtime.containers[cid].state == ContainerState.RUNNING  # within the grace
    clock.advance(ctx.settings.orphan_container_grace_s + 1)
    rec.observe()
    assert rec.wait_idle(timeout=10)
    rec.stop()
    assert cid not in runtime.containers  # removed after the grace
    assert any("a stopped cluster should not have" in m for m in _events(ctx, cid))
