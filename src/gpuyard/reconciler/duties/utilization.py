"""Utilisation history: every ``every_s`` a reading of each running cluster's CPU and
memory (the runtime's stats) and GPU utilisation (nvidia-ml-py, None without GPUs or a
driver), stored as :class:`UtilizationSample` rows; rows older than ``keep`` are
deleted in the same transaction, so the table stays bounded (an hour per cluster at
30 s: 120 rows). Runtime calls happen before the transaction (DESIGN rule 2)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import timedelta

from sqlalchemy import delete, select

from gpuyard.core.states import ClusterStatus
from gpuyard.reconciler.duties.autoterminate import nvml_utilization
from gpuyard.runtimes.base import Runtime
from gpuyard.services.context import Context
from gpuyard.store.schema import Cluster, UtilizationSample

log = logging.getLogger(__name__)

GpuUuids = Callable[[list[Cluster]], dict[str, tuple[str, ...]]]


class UtilizationRecorder:
    def __init__(
        self,
        ctx: Context,
        runtime_of: Callable[[int | None], Runtime],
        gpu_uuids: GpuUuids,
        gpu_utilization: Callable[[tuple[str, ...]], list[float] | None] = nvml_utilization,
        every_s: float = 30.0,
        keep: timedelta = timedelta(hours=1),
    ) -> None:
        self.ctx = ctx
        self.runtime_of = runtime_of
        self.gpu_uuids = gpu_uuids
        self.gpu_utilization = gpu_utilization
        self.every_s = every_s
        self.keep = keep
        self._last = float("-inf")

    def run(self) -> None:
        """Record one sample per running cluster when one is due; else nothing."""
        if time.monotonic() - self._last < self.every_s:
            return
        self._last = time.monotonic()
        with self.ctx.read() as session:
            clusters = list(
                session.scalars(
                    select(Cluster).where(Cluster.status == ClusterStatus.RUNNING.value)
                )
            )
        try:
            uuids_of = self.gpu_uuids(clusters)
        except Exception:  # no GPU readings this round; CPU and memory still count
            uuids_of = {}
        now = self.ctx.clock.now()
        rows = []
        for c in clusters:
            try:
                stats = self.runtime_of(c.host_id).stats(c.id, "view")
            except Exception as exc:  # one engine's failure is this cluster's gap alone
                log.debug("no utilisation sample for %s: %s", c.id, exc)
                continue
            if stats is None:
                continue
            gpu: float | None = None
            try:
                readings = self.gpu_utilization(uuids_of.get(c.id, ())) or []
                gpu = round(sum(readings) / len(readings), 2) if readings else None
            except Exception:  # no driver: no GPU data, not a zero
                gpu = None
            rows.append(
                UtilizationSample(
                    cluster_id=c.id,
                    at=now,
                    cpu_percent=round(stats.cpu_percent, 2),
                    memory_percent=round(stats.memory_percent, 2),
                    gpu_percent=gpu,
                )
            )
        with self.ctx.transaction() as session:
            session.add_all(rows)
            session.execute(delete(UtilizationSample).where(UtilizationSample.at < now - self.keep))
