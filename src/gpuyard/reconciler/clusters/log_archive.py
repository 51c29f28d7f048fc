"""A cluster's container output kept past its container (``cluster_log_archives``).

Stop removes the container (docs/decisions.md), and a start or restart replaces it;
the driver calls :func:`keep_logs` first, so a stopped or errored cluster's logs stay
readable (services/clusters/logs.py) until it is terminated, when :func:`forget_logs`
drops them. Each archive holds the last :data:`MAX_TAIL` lines of one container, in
the engine's timestamped format; a cluster keeps its last :data:`MAX_ARCHIVES`.

Keeping logs is best effort: a failure to read or store them is logged and never
holds up the stop or start that asked (the engine's or database's trouble then shows
in that step anyway).
"""

from __future__ import annotations

import logging

from sqlalchemy import delete, select
from sqlalchemy.exc import SQLAlchemyError

from gpuyard.core.errors import GpuyardError
from gpuyard.core.log_lines import (
    MAX_TAIL,
    LogLine,
    cap_to_boundary,
    clip,
    format_timestamped,
    ns_datetime,
)
from gpuyard.runtimes.base import ContainerState, Runtime
from gpuyard.services.context import Context
from gpuyard.store.schema import ClusterLogArchive

log = logging.getLogger(__name__)

# Containers' archives kept per cluster (a crash loop makes one per restart).
MAX_ARCHIVES = 20


def keep_logs(ctx: Context, runtime: Runtime, cluster_id: str) -> None:
    """Archive the output of the cluster's current container, if it has one. Idempotent:
    archiving the same container again replaces its archive. Never raises."""
    try:
        seen = runtime.observe(cluster_id)
        if seen.state is ContainerState.MISSING or seen.container_id is None:
            return
        lines = runtime.log_lines(cluster_id, tail=MAX_TAIL)
    except GpuyardError as exc:
        log.warning("cannot read the logs of cluster %s to keep them: %s", cluster_id, exc.code)
        return
    try:
        _store(ctx, cluster_id, seen.container_id, cap_to_boundary(lines, MAX_TAIL))
    except SQLAlchemyError as exc:
        log.warning("cannot keep the logs of cluster %s: %s", cluster_id, type(exc).__name__)


def stop_keeping_logs(ctx: Context, runtime: Runtime, cluster_id: str, timeout_s: int) -> None:
    """Stop the cluster's container (its process gets ``timeout_s`` to exit, printing
    what it prints on the way), archive its output, then remove it. Raises what
    the runtime's halt or stop raise; idempotent like them."""
    runtime.halt(cluster_id, timeout_s=timeout_s)
    keep_logs(ctx, runtime, cluster_id)
    runtime.stop(cluster_id, timeout_s=timeout_s)


def forget_logs(ctx: Context, cluster_id: str) -> None:
    """Delete every archive of the cluster (it is being terminated). Idempotent."""
    with ctx.transaction() as session:
        session.execute(delete(ClusterLogArchive).where(ClusterLogArchive.cluster_id == cluster_id))


def _store(ctx: Context, cluster_id: str, container_id: str, lines: list[LogLine]) -> None:
    lines = [LogLine(line.ts_ns, clip(line.text)) for line in lines]
    first = lines[0].ts_ns if lines else None
    last = lines[-1].ts_ns if lines else None
    now = ctx.clock.now()
    with ctx.transaction() as session:
        row = session.scalar(
            select(ClusterLogArchive).where(
                ClusterLogArchive.cluster_id == cluster_id,
                ClusterLogArchive.container_id == container_id,
            )
        )
        if row is None:
            row = ClusterLogArchive(cluster_id=cluster_id, container_id=container_id)
            session.add(row)
        row.text = format_timestamped(lines)
        row.line_count = len(lines)
        row.first_at = ns_datetime(first) if first is not None else None
        row.last_at = ns_datetime(last) if last is not None else None
        row.captured_at = now
        session.flush()
        keep = session.scalars(
            select(ClusterLogArchive.id)
            .where(ClusterLogArchive.cluster_id == cluster_id)
            .order_by(ClusterLogArchive.id.desc())
            .limit(MAX_ARCHIVES)
        ).all()
        session.execute(
            delete(ClusterLogArchive).where(
                ClusterLogArchive.cluster_id == cluster_id, ClusterLogArchive.id.not_in(keep)
            )
        )
