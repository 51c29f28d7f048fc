"""A host's live clusters (heartbeats: unreachable, back again) and the metrics scrape
are read through indexes, never by walking terminated clusters; they still see every
live cluster, count the terminated ones and sum the rates as before. Fake runtime,
real database."""

from __future__ import annotations

from collections import defaultdict
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import pytest
from prometheus_client.metrics_core import Metric
from sqlalchemy import Engine, select

from gpuyard.observability.metrics import CLUSTERS, SPEND_RATE, StoreCollector
from gpuyard.reconciler.loop import Reconciler
from gpuyard.services.clusters import use_cases as uc
from gpuyard.services.clusters.views import cluster_rate
from gpuyard.services.context import Context
from gpuyard.services.fleet.health import record_heartbeat
from gpuyard.services.tenancy.auth import Principal
from gpuyard.store.schema import Cluster, Event
from tests.service.test_lifecycle import a6000, settle
from tests.service.test_reconciler_history import _history, _history_scans, _statements


def _sqlite(ctx: Context) -> bool:
    return ctx.settings.effective_database_url.startswith("sqlite")


def _capture(ctx: Context) -> AbstractContextManager[list[tuple[str, Any]]]:
    """The statements run within (SQLite only: its plans are checked)."""
    none: list[tuple[str, Any]] = []
    return _statements(ctx) if _sqlite(ctx) else nullcontext(none)


def _plans(ctx: Context, statements: list[tuple[str, Any]], marker: str) -> list[str]:
    """SQLite's plan of each captured statement whose SQL contains ``marker``."""
    bind = ctx.sessions.kw["bind"]
    assert isinstance(bind, Engine)
    raw = bind.raw_connection()
    try:
        cur = raw.cursor()
        return [
            " | ".join(str(row[-1]) for row in cur.execute("EXPLAIN QUERY PLAN " + sql, params))
            for sql, params in {s: p for s, p in statements}.items()
            if marker in sql
        ]
    finally:
        raw.close()


def _host_events(ctx: Context, cid: str) -> list[str]:
    with ctx.read() as s:
        return list(
            s.scalars(select(Event.message).where(Event.cluster_id == cid, Event.type == "host"))
        )


def test_a_host_away_and_back_tells_its_live_clusters_only(
    ctx: Context, alice: Principal, rec: Reconciler
) -> None:
    _history(ctx, alice, rec, 2)
    live = uc.create_cluster(ctx, alice, a6000(1))
    settle(rec, live.id)
    host = live.host_id
    assert host is not None
    with ctx.read() as s:
        dead = list(s.scalars(select(Cluster.id).where(Cluster.status == "terminated")))
    assert len(dead) == 2
    record_heartbeat(ctx, [host], None, misses_allowed=1)
    with _capture(ctx) as statements:
        assert record_heartbeat(ctx, [host], "engine gone", misses_allowed=1) == [host]
        assert record_heartbeat(ctx, [host], None, misses_allowed=1) == [host]
    events = _host_events(ctx, live.id)
    assert len(events) == 2
    assert "is unreachable" in events[0] and "answers again" in events[1]
    assert all(_host_events(ctx, cid) == [] for cid in dead)
    if _sqlite(ctx):
        assert _history_scans(ctx, statements) == []
        # The host's clusters: by host and live status, not by host alone (which would
        # walk the host's terminated clusters in the index).
        plans = _plans(ctx, statements, "WHERE clusters.host_id = ")
        assert plans and all("(host_id=? AND status=?)" in plan for plan in plans), plans


def _samples(metrics: list[Metric], name: str) -> dict[str, float]:
    family = next(m for m in metrics if m.name == name)
    return {s.labels["status"]: s.value for s in family.samples}


def test_a_metrics_scrape_counts_and_rates_without_walking_history(
    ctx: Context, alice: Principal, rec: Reconciler
) -> None:
    _history(ctx, alice, rec, 3)
    for spec in (a6000(1), a6000(2, volume_gb=5)):
        c = uc.create_cluster(ctx, alice, spec)
        settle(rec, c.id)
    stopped = uc.create_cluster(ctx, alice, a6000(1, volume_gb=3))
    settle(rec, stopped.id)
    uc.stop_cluster(ctx, alice, stopped.id)
    settle(rec, stopped.id)
    with _capture(ctx) as statements:
        metrics = list(StoreCollector(ctx).collect())
    counts = _samples(metrics, CLUSTERS)
    assert counts["terminated"] == 3 and counts["running"] == 2 and counts["stopped"] == 1
    # The rates, summed cluster by cluster from the full rows.
    expected: dict[str, float] = defaultdict(float)
    with ctx.read() as s:
        _, gpus = ctx.references.get(s)
        for c in s.scalars(select(Cluster)):
            gpu = gpus.get(c.gpu_type) if c.gpu_type else None
            expected[c.status] += cluster_rate(c, gpu, ctx.settings.prices).total
    rates = _samples(metrics, SPEND_RATE)
    assert rates["running"] == pytest.approx(expected["running"]) and rates["running"] > 0
    assert rates["stopped"] == pytest.approx(expected["stopped"]) and rates["stopped"] > 0
    assert rates["terminated"] == 0
    if _sqlite(ctx):
        assert _history_scans(ctx, statements) == []
