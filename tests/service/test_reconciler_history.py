"""History does not slow the reconciler: its periodic queries read indexes (never a
walk over terminated clusters, their events or intervals), the resting-GPU sweep is
driven from the allocations, and a full pass is counted once every engine was
observed. Fake runtime, real database."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import Engine, event, select, update

from gpuyard.reconciler.loop import Reconciler
from gpuyard.reconciler.wiring import build_reconciler
from gpuyard.services.clusters import use_cases as uc
from gpuyard.services.context import Context
from gpuyard.services.tenancy.auth import Principal
from gpuyard.store.schema import Cluster, GpuAllocation
from gpuyard.testing.fake_runtime import FakeRuntime
from tests.service.test_lifecycle import a6000, gpus_held, settle

# A plan step that reads a history table row by row: a SCAN of it, unless the scan
# walks the partial index of live clusters (terminated rows are not in it).
_HISTORY_SCAN = re.compile(r"^SCAN (clusters|usage_intervals|events)\b(?!.*ix_clusters_live)")


def _history(ctx: Context, alice: Principal, rec: Reconciler, n: int) -> None:
    """``n`` clusters that ran and were terminated (rows, events, closed intervals)."""
    for _ in range(n):
        c = uc.create_cluster(ctx, alice, a6000(1, volume_gb=1))
        settle(rec, c.id)
        uc.terminate_cluster(ctx, alice, c.id)
        settle(rec, c.id)


@contextmanager
def _statements(ctx: Context) -> Iterator[list[tuple[str, Any]]]:
    seen: list[tuple[str, Any]] = []
    bind = ctx.sessions.kw["bind"]
    assert isinstance(bind, Engine)

    def capture(_c: Any, _cur: Any, sql: str, params: Any, _ctx: Any, many: bool) -> None:
        seen.append((sql, params[0] if many else params))

    event.listen(bind, "before_cursor_execute", capture)
    try:
        yield seen
    finally:
        event.remove(bind, "before_cursor_execute", capture)


def _history_scans(ctx: Context, statements: list[tuple[str, Any]]) -> list[str]:
    """Each captured SELECT/UPDATE/DELETE whose SQLite plan walks a history table."""
    bad = []
    bind = ctx.sessions.kw["bind"]
    assert isinstance(bind, Engine)
    raw = bind.raw_connection()
    try:
        cur = raw.cursor()
        for sql, params in {s: p for s, p in statements}.items():
            if not sql.lstrip().upper().startswith(("SELECT", "UPDATE", "DELETE")):
                continue
            plan = [str(row[-1]) for row in cur.execute("EXPLAIN QUERY PLAN " + sql, params)]
            if any(_HISTORY_SCAN.match(step) for step in plan):
                bad.append(f"{sql}\n  -> {' | '.join(plan)}")
    finally:
        raw.close()
    return bad


def test_a_reconcile_pass_reads_no_history_table_row_by_row(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime
) -> None:
    if not ctx.settings.effective_database_url.startswith("sqlite"):
        pytest.skip("the plans checked are SQLite's (EXPLAIN QUERY PLAN)")
    _history(ctx, alice, rec, 3)
    live = uc.create_cluster(ctx, alice, a6000(1, volume_gb=1))
    settle(rec, live.id)
    with _statements(ctx) as statements:
        rec.run_pass(observe=False)
        rec.heartbeat_now()  # heartbeat, observe, drained restarts, old copies
        rec.observe()  # with the resting-GPU sweep
        rec.scan_volumes()
        rec.volume_usage.run(runtime, ())
    assert statements, "the pass ran no query: the listener saw nothing"
    assert _history_scans(ctx, statements) == []


def test_the_check_flags_a_walk_over_terminated_clusters(ctx: Context) -> None:
    """The plan check itself: the query the sweep used to run is caught."""
    if not ctx.settings.effective_database_url.startswith("sqlite"):
        pytest.skip("the plans checked are SQLite's (EXPLAIN QUERY PLAN)")
    with _statements(ctx) as statements, ctx.read() as session:
        session.execute(select(Cluster.id).where(Cluster.status != "terminated"))
        session.execute(select(Cluster.id).where(Cluster.status.not_in(["running", "starting"])))
    assert len(_history_scans(ctx, statements)) == 2


def test_resting_gpus_are_freed_and_other_holders_left(
    ctx: Context, alice: Principal, rec: Reconciler
) -> None:
    running = uc.create_cluster(ctx, alice, a6000(1))
    settle(rec, running.id)
    resting = uc.create_cluster(ctx, alice, a6000(1))
    settle(rec, resting.id)
    with ctx.transaction() as session:
        # A crash between the status change and the release: stopped, GPU still held.
        session.execute(update(Cluster).where(Cluster.id == resting.id).values(status="stopped"))
        # A training node's owner id holds a GPU too (no cluster row of that id).
        session.add(GpuAllocation(host_id=running.host_id, gpu_index=3, cluster_id="tn-owner-1"))
    assert gpus_held(ctx, resting.id) != []

    rec.observe()

    assert gpus_held(ctx, resting.id) == []
    assert gpus_held(ctx, running.id) != []
    assert gpus_held(ctx, "tn-owner-1") == [3]


def test_a_full_pass_is_counted_once_every_engine_was_observed(
    ctx: Context, alice: Principal, runtime: FakeRuntime
) -> None:
    counted: list[int] = []
    rec = build_reconciler(ctx, runtime, on_full_pass=lambda: counted.append(rec.full_passes))
    rec.run_pass(observe=True)
    assert rec.wait_idle(10)
    assert counted == [1]

    runtime.unavailable = "engine restarting"
    rec.run_pass(observe=True)
    assert rec.wait_idle(10)
    assert counted == [1], "an engine that did not answer made the pass full"
    rec.queue.close(wait=True)
