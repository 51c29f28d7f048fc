"""The metrics of one server, in its own :class:`CollectorRegistry`.

- Store state is read at scrape time (:class:`StoreCollector`): a few queries per
  scrape, nothing kept up to date on the request or reconcile paths.
- API latency is observed by the ASGI middleware in ``api/http/metrics.py``.
- The reconciler reports each loop pass through its ``on_pass`` hook.
- Event counters live in ``counters.py``.
"""

from __future__ import annotations

import logging
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Iterable, Iterator
from types import SimpleNamespace
from typing import cast

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from sqlalchemy import func, select

from gpuyard.core.placement import AllocationRatios, free_resources
from gpuyard.core.states import ClusterStatus
from gpuyard.observability.counters import EventCounters, bind
from gpuyard.services.clusters.views import cluster_rate
from gpuyard.services.context import Context
from gpuyard.services.fleet.hosts import capacities
from gpuyard.store.schema import Cluster

log = logging.getLogger(__name__)

CLUSTERS = "gpuyard_clusters"
GPUS_ALLOCATED = "gpuyard_gpus_allocated"
GPUS_FREE = "gpuyard_gpus_free"
SPEND_RATE = "gpuyard_spend_rate_per_hour"
STORE_UP = "gpuyard_metrics_store_up"
HTTP_DURATION = "gpuyard_http_request_duration_seconds"
LOOP_LAG = "gpuyard_reconciler_loop_lag_seconds"
PASS_DURATION = "gpuyard_reconciler_pass_duration_seconds"
FULL_PASSES = "gpuyard_reconciler_full_passes"

_LATENCY_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip
_LOOP_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# Statuses whose rows cost nothing (a terminated cluster keeps no volume).
_FREE_STATUSES = (ClusterStatus.TERMINATED.value,)
# Every other status, spelled out: an IN list reads the status index, where NOT IN
# would walk every terminated cluster.
_BILLED_STATUSES = tuple(s.value for s in ClusterStatus if s.value not in _FREE_STATUSES)
# What a cluster's rate depends on (services/clusters/views.cluster_rate).
_RATE_COLUMNS = (
    Cluster.status,
    Cluster.gpu_type,
    Cluster.gpu_count,
    Cluster.cpu_cores,
    Cluster.memory_gb,
    Cluster.container_disk_gb,
    Cluster.volume_gb,
    Cluster.cloud_type,
    Cluster.interruptible,
    Cluster.bid_per_gpu,
)
_RATE_NAMES = tuple(c.key for c in _RATE_COLUMNS)


class StoreCollector(Collector):
    """Clusters by status, GPUs allocated/free by type and the spend rate by status,
    read from the store when scraped."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def describe(self) -> Iterable[Metric]:
        return list(self._families())

    def _families(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily(CLUSTERS, "Clusters by status.", labels=["status"])
        yield GaugeMetricFamily(
            GPUS_ALLOCATED, "GPUs allocated to clusters, by GPU type.", labels=["gpu_type"]
        )
        yield GaugeMetricFamily(
            GPUS_FREE, "GPUs free on healthy hosts, by GPU type.", labels=["gpu_type"]
        )
        yield GaugeMetricFamily(
            SPEND_RATE,
            "Sum of the clusters' current hourly rates, by cluster status.",
            labels=["status", "currency"],
        )
        yield GaugeMetricFamily(STORE_UP, "1 when the last scrape could read the store.")

    def collect(self) -> Iterable[Metric]:
        clusters, allocated, free, spend, up = self._families()
        try:
            counts, rates, gpus_allocated, gpus_free = self._read()
        except Exception:
            log.exception("metrics: cannot read the store")
            up.add_metric([], 0.0)
            return [up]
        for status in ClusterStatus:
            clusters.add_metric([status.value], counts.get(status.value, 0))
            spend.add_metric([status.value, "USD"], round(rates.get(status.value, 0.0), 6))
        for gpu_type in sorted(gpus_allocated.keys() | gpus_free.keys()):
            allocated.add_metric([gpu_type], gpus_allocated.get(gpu_type, 0))
            free.add_metric([gpu_type], gpus_free.get(gpu_type, 0))
        up.add_metric([], 1.0)
        return [clusters, allocated, free, spend, up]

    def _read(
        self,
    ) -> tuple[dict[str, int], dict[str, float], dict[str, int], dict[str, int]]:
        ctx = self.ctx
        with ctx.read() as session:
            # Live clusters through the status index, grouped in the database. The
            # terminated ones are counted apart, from that index alone (no row is read):
            # history costs an index count per scrape, never a walk of its rows.
            counts = {
                status: int(n)
                for status, n in session.execute(
                    select(Cluster.status, func.count())
                    .where(Cluster.status.in_(_BILLED_STATUSES))
                    .group_by(Cluster.status)
                )
            }
            counts[ClusterStatus.TERMINATED.value] = int(
                session.scalar(
                    select(func.count()).where(Cluster.status == ClusterStatus.TERMINATED.value)
                )
                or 0
            )
            # One row per distinct shape and status (what a rate depends on), with how
            # many clusters share it: a few rows however many clusters run.
            shapes = session.execute(
                select(*_RATE_COLUMNS, func.count())
                .where(Cluster.status.in_(_BILLED_STATUSES))
                .group_by(*_RATE_COLUMNS)
            ).all()
            _, gpu_types = ctx.references.get(session)
            hosts = capacities(session)
        rates: dict[str, float] = defaultdict(float)
        for *shape, n in shapes:
            # The columns cluster_rate reads, by name (as a Cluster row would have them).
            c = cast(Cluster, SimpleNamespace(**dict(zip(_RATE_NAMES, shape, strict=True))))
            gpu = gpu_types.get(c.gpu_type) if c.gpu_type else None
            rates[c.status] += cluster_rate(c, gpu, ctx.settings.prices).total * int(n)
        total: dict[str, int] = defaultdict(int)
        free: dict[str, int] = defaultdict(int)
        for host in hosts:
            for gpu_info in host.gpus:
                total[gpu_info.gpu_type] += 1
            for gpu_type, n in free_resources(host, AllocationRatios()).get("gpus", {}).items():
                free[gpu_type] += n
        allocated = {t: n - free.get(t, 0) for t, n in total.items()}
        return counts, dict(rates), allocated, dict(free)


class LoopHistogram(Collector):
    """A histogram for values observed from one thread only (the event loop): no locks,
    one ``bisect`` and two list updates per observation, where prometheus-client's
    ``Histogram`` takes a lock per bucket touched (about 2 µs). A scrape from another
    thread copies each series' list, which the GIL makes atomic."""

    def __init__(
        self, name: str, documentation: str, labelnames: tuple[str, ...], buckets: Iterable[float]
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = labelnames
        self.bounds = sorted(buckets)
        self._les = [repr(float(b)) for b in self.bounds]
        self._series: dict[tuple[str, ...], list[float]] = {}

    def series(self, labels: tuple[str, ...]) -> list[float]:
        """The counters of one label set: a count per bucket, the +Inf count, the sum."""
        data = self._series.get(labels)
        if data is None:
            data = self._series.setdefault(labels, [0.0] * (len(self.bounds) + 2))
        return data

    def observe(self, series: list[float], value: float) -> None:
        series[bisect_left(self.bounds, value)] += 1
        series[-1] += value

    def describe(self) -> Iterable[Metric]:
        return [HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)]

    def collect(self) -> Iterable[Metric]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for labels, data in list(self._series.items()):
            snapshot = list(data)
            cumulative, buckets = 0.0, []
            for le, n in zip(self._les, snapshot, strict=False):
                cumulative += n
                buckets.append((le, cumulative))
            buckets.append(("+Inf", cumulative + snapshot[-2]))
            family.add_metric(list(labels), buckets, snapshot[-1])
        return [family]


class Metrics:
    """Everything one server exposes at ``/metrics``."""

    def __init__(self, ctx: Context) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(StoreCollector(ctx))
        self.counters = EventCounters(self.registry)
        bind(ctx, self.counters)
        self.http_duration = LoopHistogram(
            HTTP_DURATION,
            "API request latency, by method, route template and status.",
            ("method", "route", "status"),
            _LATENCY_BUCKETS,
        )
        self.registry.register(self.http_duration)
        self.loop_lag = Histogram(
            LOOP_LAG,
            "Seconds from when a reconciler pass was due (a wake-up or the end of its "
            "interval) to when it started.",
            buckets=_LOOP_BUCKETS,
            registry=self.registry,
        )
        self.pass_duration = Histogram(
            PASS_DURATION,
            "Duration of a reconciler loop pass (dispatch, auto-termination, observation).",
            buckets=_LOOP_BUCKETS,
            registry=self.registry,
        )

        self.full_passes = Counter(
            FULL_PASSES,
            "Reconciler passes that observed every engine this server owns (the first "
            "one after a start: the server has compared the store with its engines).",
            registry=self.registry,
        )

    def count_full_pass(self) -> None:
        """The reconciler's ``on_full_pass`` hook."""
        self.full_passes.inc()

    def observe_pass(self, lag_s: float, duration_s: float) -> None:
        """The reconciler's ``on_pass`` hook."""
        self.loop_lag.observe(lag_s)
        self.pass_duration.observe(duration_s)
