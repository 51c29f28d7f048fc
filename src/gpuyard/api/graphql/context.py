"""Per-request context of a GraphQL execution: who calls, and what this request has
already loaded (so no field reads the same thing twice: no N+1).

A context lives for one operation and one worker thread (and that thread's event
loop, on which the operation's loaders run); it is not shared between requests, so
its caches need no lock. Every read is scoped to the caller's account. What is shared
between requests (GPU UUIDs, runtime stats) lives in the app's executor and is handed
in.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from sqlalchemy import select

from gpuyard.api.graphql.loaders import Loaders
from gpuyard.api.state import AppState
from gpuyard.core.models import HostCapacity
from gpuyard.runtimes.base import ContainerStats
from gpuyard.services.billing.spot import Market, load_market
from gpuyard.services.clusters import use_cases as uc
from gpuyard.services.clusters import views as cluster_views
from gpuyard.services.context import Context
from gpuyard.services.fleet.runtime_stats import RuntimeStatsCache, StatsKey
from gpuyard.services.tenancy.auth import Principal
from gpuyard.store.schema import HostGpu

# RunPod answers every pod of the user at once; this bounds one answer.
MAX_LISTED = 500
# Host GPUs (and their UUIDs) change only when a host registers: reads may lag this much.
GPU_UUID_TTL_S = 5.0


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
    # The app's runtime stats, shared by every request (one engine call per container
    # per few seconds).
    stats_cache: RuntimeStatsCache = field(default_factory=RuntimeStatsCache)
    # The request's ``Idempotency-Key`` header, as sent (the deploy mutations use it).
    idempotency_key: str | None = None
    _clusters: list[cluster_views.ClusterDetails] | None = None
    _loaders: Loaders | None = None
    _market: Market | None = None
    # Container stats fetched for a whole list before its pods resolve.
    prefetched_stats: dict[StatsKey, ContainerStats | None] = field(default_factory=dict)

    @property
    def ctx(self) -> Context:
        return self.state.ctx

    @property
    def loaders(self) -> Loaders:
        """This operation's batched loaders (built on first use, on the operation's
        event loop)."""
        if self._loaders is None:
            self._loaders = Loaders(self.state, self.principal, self.stats_cache)
        return self._loaders

    def clusters(self) -> list[cluster_views.ClusterDetails]:
        """The caller's clusters (not terminated), newest first, loaded once per
        request with one batched ``details`` call; the details loader is primed with
        them (a ``cluster(input)`` of a listed id reads nothing more)."""
        if self._clusters is None:
            page = uc.list_clusters(self.ctx, self.principal, per_page=MAX_LISTED)
            self._clusters = cluster_views.details(self.ctx, page.clusters)
            self.loaders.details.prime_many({d.cluster.id: d for d in self._clusters})
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

    async def prefetch_stats(self, keys: list[StatsKey]) -> None:
        """Fetch these containers' stats in one batch of the stats loader and keep them
        for the ``container`` fields that follow."""
        values = await self.loaders.stats.load_many(keys)
        self.prefetched_stats.update(zip(keys, values, strict=True))

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
