"""Per-request context of a GraphQL execution: who calls, and what this request has
already loaded (so no field reads the same thing twice: no N+1).

A context lives for one operation and one worker thread; it is not shared between
requests, so its caches need no lock. Every read is scoped to the caller's account.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from sqlalchemy import select

from gpuyard.api.state import AppState
from gpuyard.core.errors import GpuyardError
from gpuyard.core.models import HostCapacity
from gpuyard.runtimes.base import ContainerStats
from gpuyard.services import cluster_views
from gpuyard.services import clusters as uc
from gpuyard.services.auth import Principal
from gpuyard.services.context import Context
from gpuyard.services.spot import Market, load_market
from gpuyard.store.schema import Cluster, HostGpu

# RunPod answers every pod of the user at once; this bounds one answer.
MAX_LISTED = 500
# Host GPUs (and their UUIDs) change only when a host registers: reads may lag this much.
GPU_UUID_TTL_S = 5.0
# A stats call slower than this means a real engine: fetch the rest in parallel.
_SLOW_STATS_S = 0.002
_stats_pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="gql-stats")


class GpuUuidCache:
    """UUIDs of every host GPU by (host id, index), re-read at most every
    ``GPU_UUID_TTL_S`` seconds; shared by the requests of one app (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._expires = 0.0
        self._uuids: dict[tuple[int, int], str | None] = {}

    def get(self, ctx: Context) -> dict[tuple[int, int], str | None]:
        with self._lock:
            if time.monotonic() < self._expires:
                return self._uuids
        with ctx.read() as session:
            uuids = {
                (r.host_id, r.gpu_index): r.uuid
                for r in session.execute(select(HostGpu.host_id, HostGpu.gpu_index, HostGpu.uuid))
            }
        with self._lock:
            self._uuids, self._expires = uuids, time.monotonic() + GPU_UUID_TTL_S
        return uuids


@dataclass
class GqlContext:
    """What resolvers get as ``info.context``."""

    state: AppState
    principal: Principal
    gpu_uuids: GpuUuidCache = field(default_factory=GpuUuidCache)
    # The request's ``Idempotency-Key`` header, as sent (the deploy mutations use it).
    idempotency_key: str | None = None
    _clusters: list[cluster_views.ClusterDetails] | None = None
    _stats: dict[str, ContainerStats | None] = field(default_factory=dict)
    _market: Market | None = None

    @property
    def ctx(self) -> Context:
        return self.state.ctx

    def clusters(self) -> list[cluster_views.ClusterDetails]:
        """The caller's clusters (not terminated), newest first, loaded once per
        request with one batched ``details`` call."""
        if self._clusters is None:
            page = uc.list_clusters(self.ctx, self.principal, per_page=MAX_LISTED)
            with self.ctx.read() as session:
                self._clusters = cluster_views.details(self.ctx, page.clusters, session)
        return self._clusters

    def cluster(self, cluster_id: str) -> cluster_views.ClusterDetails:
        """One of the caller's clusters (terminated ones included). Raises
        ClusterNotFound for an unknown id, another account's cluster or one of a
        project the caller may not use."""
        if self._clusters is not None:
            for d in self._clusters:
                if d.cluster.id == cluster_id:
                    return d
        principal = self.principal
        return cluster_views.load_visible(
            self.ctx, principal.account_id, cluster_id, principal.project_ids
        )

    def stats(self, cluster_id: str) -> ContainerStats | None:
        """Container stats from the runtime, outside any transaction. The first call
        fetches every listed running cluster's stats (in parallel when the engine
        proves slow), so a list costs one round of engine calls."""
        if cluster_id in self._stats:
            return self._stats[cluster_id]
        wanted = [cluster_id]
        if self._clusters is not None:
            wanted += [
                d.cluster.id
                for d in self._clusters
                if d.cluster.status == "running"
                and d.cluster.id != cluster_id
                and d.cluster.id not in self._stats
            ]
        hosts = self._hosts_of(wanted)

        def stats_of(cid: str) -> ContainerStats | None:
            # Each cluster's stats come from its own host's engine.
            try:
                runtime = self.state.runtime_of(hosts.get(cid))
            except GpuyardError:
                return None
            return _safe_stats(runtime.stats, cid)

        started = time.monotonic()
        self._stats[cluster_id] = stats_of(cluster_id)
        rest = wanted[1:]
        if rest and time.monotonic() - started > _SLOW_STATS_S:
            for cid, value in zip(rest, _stats_pool.map(stats_of, rest), strict=True):
                self._stats[cid] = value
        else:
            for cid in rest:
                self._stats[cid] = stats_of(cid)
        return self._stats[cluster_id]

    def _hosts_of(self, cluster_ids: list[str]) -> dict[str, int | None]:
        """The host of each cluster: from the listed clusters, else one read."""
        known = {d.cluster.id: d.cluster.host_id for d in self._clusters or []}
        missing = [cid for cid in cluster_ids if cid not in known]
        if missing:
            with self.ctx.read() as session:
                rows = session.execute(
                    select(Cluster.id, Cluster.host_id).where(Cluster.id.in_(missing))
                )
                known.update({cid: host_id for cid, host_id in rows})
        return known

    def market(self) -> Market:
        """Every healthy host's capacity and use, and the live bids: read once per
        request (prices of many GPU types, free GPUs of many machines)."""
        if self._market is None:
            self._market = load_market(self.ctx)
        return self._market

    def capacities(self) -> dict[int, HostCapacity]:
        """Every healthy host's capacity and use, by host id."""
        return {h.host_id: h for h in self.market().hosts}

    def gpu_uuid(self, host_id: int, index: int) -> str | None:
        """The UUID of a host's GPU (None for declared GPUs without one)."""
        return self.gpu_uuids.get(self.ctx).get((host_id, index))


def _safe_stats(
    stats: Callable[[str], ContainerStats | None], cluster_id: str
) -> ContainerStats | None:
    """Stats, or None when the engine cannot say: a runtime failure must not fail the
    whole query (``container`` is simply null)."""
    try:
        return stats(cluster_id)
    except GpuyardError:
        return None
