"""Batched loaders of one GraphQL operation (Strawberry DataLoaders): every field of
a list that needs a read of its own asks a loader, and the loader reads all the keys
asked in the same tick at once.

- ``details``: cluster id -> :class:`ClusterDetails` (hosts, GPU names, rate, costs,
  ports, policies, volumes: cluster_views.details builds them in a few queries for
  any number of clusters). A list primes it, so ``cluster(input)`` for a listed id
  reads nothing more.
- ``stats``: :class:`StatsKey` -> container stats, through the app's shared
  :class:`RuntimeStatsCache`: the misses are fetched concurrently on the cache's
  threads (never on an event loop), each container at most once per few seconds
  whoever polls.

Loaders live for one operation: they are built by the operation's context and bound
to the event loop the operation runs on (endpoint.py: a worker thread's own loop).
The details batch reads the database on that loop; the loop serves this operation
only, so the read stalls nothing else.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import Future

from strawberry.dataloader import DataLoader

from gpuyard.api.state import AppState
from gpuyard.core.errors import ClusterNotFound, GpuyardError
from gpuyard.runtimes.base import ContainerStats
from gpuyard.services.clusters.reads import visible_details
from gpuyard.services.clusters.views import ClusterDetails
from gpuyard.services.fleet.runtime_stats import RuntimeStatsCache, StatsKey
from gpuyard.services.tenancy.auth import Principal

Stats = ContainerStats | None


def _not_found(cluster_id: str) -> ClusterNotFound:
    return ClusterNotFound(f"cluster {cluster_id!r} not found", {"cluster_id": cluster_id})


class Loaders:
    """The loaders of one operation, for ``principal`` on ``state``'s app."""

    def __init__(self, state: AppState, principal: Principal, stats_cache: RuntimeStatsCache):
        self._state = state
        self._principal = principal
        self._stats_cache = stats_cache
        self.details: DataLoader[str, ClusterDetails] = DataLoader(load_fn=self._load_details)
        self.stats: DataLoader[StatsKey, Stats] = DataLoader(load_fn=self._load_stats)

    async def _load_details(self, ids: list[str]) -> list[ClusterDetails | BaseException]:
        found = visible_details(self._state.ctx, self._principal, ids)
        return [found.get(i) or _not_found(i) for i in ids]

    def _fetch_stats(self, key: StatsKey) -> Stats:
        """One engine call (on a cache thread): the container's stats from its host's
        engine. Raises GpuyardError when the engine cannot say."""
        return self._state.runtime_of(key.host_id).stats(key.cluster_id)

    async def _load_stats(self, keys: list[StatsKey]) -> list[Stats | BaseException]:
        futures = self._stats_cache.get_many(keys, self._fetch_stats)
        out: list[Stats | BaseException] = [_settled(f) if f.done() else None for f in futures]
        pending = [i for i, f in enumerate(futures) if not f.done()]
        if pending:
            # Wrapped only when still running: wrapping a settled future costs a
            # thread-safe wake-up of the loop for nothing.
            got = await asyncio.gather(
                *(asyncio.wrap_future(futures[i]) for i in pending), return_exceptions=True
            )
            for i, value in zip(pending, got, strict=True):
                out[i] = value
        # A runtime failure must not fail the whole query: the field is null.
        return [None if isinstance(v, GpuyardError) else v for v in out]


def _settled(future: Future[Stats]) -> Stats | BaseException:
    exc = future.exception()
    return exc if exc is not None else future.result()
