"""Observation: each engine's containers of this installation are compared with the
store, looking only at our objects:

- a running cluster whose container died is brought back (ClusterDriver.recover);
- a container of ours that no cluster should have is removed once it has been seen
  so for the grace period (``GPUYARD_ORPHAN_CONTAINER_GRACE_S``);
- the hosts show whether their engine enforces limits;
- less often, the engine's volumes are scanned (duties/volume_scans.py) and the
  maintenance of the volume-scan cadence is done.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from sqlalchemy import Select, func, select, true

from gpuyard.core.errors import GpuyardError
from gpuyard.core.states import MAY_HAVE_CONTAINER, ClusterStatus
from gpuyard.reconciler.clusters.collection import ContainerCollector
from gpuyard.reconciler.duties.volume_scans import VolumeScans
from gpuyard.reconciler.duties.volume_usage import VolumeUsage
from gpuyard.reconciler.hosts import HostDirectory
from gpuyard.reconciler.lanes import SLOW, STORAGE, URGENT, Dispatcher
from gpuyard.reconciler.leases import MAINTENANCE_DUTY, Leases
from gpuyard.runtimes.base import ContainerState, Runtime
from gpuyard.runtimes.fleet import SHARED_ENGINE
from gpuyard.services.context import Context
from gpuyard.services.idempotency import purge_expired
from gpuyard.store.schema import Cluster, Host

log = logging.getLogger(__name__)

# Clusters that may have a container (on the hosts of an engine, when it has hosts):
# id and status, the observe pass's comparison with the engine's listing.
_MAY_HAVE = select(Cluster.id, Cluster.status).where(
    Cluster.status.in_([s.value for s in MAY_HAVE_CONTAINER])
)


def _fingerprint(scope: Select[str, str]) -> Select[int, Any, Any, Any, Any]:
    """An aggregate of the rows ``scope`` selects that changes when one of them comes,
    goes or is written through the status funnel or a guarded update (each bumps the
    version and sets updated_at), computed in the database: no row reaches Python."""
    return select(
        func.count(),
        func.sum(Cluster.version),
        func.max(Cluster.updated_at),
        func.min(Cluster.id),
        func.max(Cluster.id),
    ).where(scope.whereclause if scope.whereclause is not None else true())


class Observation:
    """Observes engines. ``recover``: brings a cluster whose container died back (the
    driver's); ``forget_snapshots``: drops deleted and failed snapshots' data from the
    repository (the snapshot worker's)."""

    def __init__(
        self,
        ctx: Context,
        hosts: HostDirectory,
        dispatcher: Dispatcher,
        leases: Leases,
        *,
        recover: Callable[[str], None],
        collector: ContainerCollector,
        volume_usage: VolumeUsage,
        volume_scans: VolumeScans,
        forget_snapshots: Callable[[], None],
    ) -> None:
        self.ctx = ctx
        self.hosts = hosts
        self.dispatcher = dispatcher
        self.leases = leases
        self.recover = recover
        self.collector = collector
        self.volume_usage = volume_usage
        self.volume_scans = volume_scans
        self.forget_snapshots = forget_snapshots
        # Per engine: its last listing (cluster id -> state) and the fingerprint of the
        # clusters it was compared with, kept while that comparison found nothing to do.
        self._last_compare: dict[str, tuple[dict[str, ContainerState], tuple[Any, ...]]] = {}
        # Containers of ours that no cluster should have: when each was first seen so.
        self._unknown_since: dict[tuple[str, str], datetime] = {}

    def observe_engine(self, key: str, host_ids: tuple[int, ...]) -> bool:
        """Compare one engine's containers of this installation (and, less often, its
        volumes) with the store; see the module docstring. False when the engine
        could not list its containers (nothing was compared)."""
        runtime = self.hosts.runtime_of(host_ids)
        try:
            containers = runtime.list_managed()
        except GpuyardError as exc:
            # An engine that does not answer (e.g. restarting) is not evidence that
            # anything died: nothing is recovered or collected until it answers.
            log.warning("cannot list containers on %s: %s", key, exc.message)
            return False
        listed_at = self.ctx.clock.now()
        states = {c.cluster_id: c.state for c in containers}
        shared = key == SHARED_ENGINE
        scope = _MAY_HAVE.where(Cluster.host_id.in_(host_ids)) if not shared else _MAY_HAVE
        with self.ctx.connect() as conn:
            fingerprint = tuple(conn.execute(_fingerprint(scope)).one())
            last = self._last_compare.get(key)
            if last is not None and last == (states, fingerprint):
                # The engine lists what it listed last time and no cluster that may have
                # a container changed since: last time's comparison found nothing to
                # recover or collect, and would find the same now.
                live: dict[str, str] | None = None
            else:
                live = {cid: status for cid, status in conn.execute(scope)}
        if live is not None:
            recovering = self._recover_dead(live, states, listed_at, host_ids)
            unexpected = states.keys() - live.keys()
            self._collect_containers(key, host_ids, unexpected, listed_at)
            if recovering or unexpected:
                self._last_compare.pop(key, None)
            else:
                self._last_compare[key] = (states, fingerprint)
        self._sync_host_limits(runtime, host_ids)
        if self.volume_usage.due(key):
            # A disk-usage report may walk every volume: off the heartbeat's lane.
            job = partial(self.volume_usage.run, runtime, host_ids)
            self.dispatcher.submit(("volume-usage", key), self.dispatcher.lane(SLOW, key), job)
        if self.volume_scans.due(key):
            self.volume_scans.scan_engine(runtime, host_ids)
            self._maintain(key, runtime)
        return True

    def _maintain(self, key: str, runtime: Runtime) -> None:
        """The work of the volume-scan cadence besides the scan."""
        if self.leases.holds(MAINTENANCE_DUTY):
            purge_expired(self.ctx)  # idempotency keys past their 24 h
            # Data of deleted and failed snapshots leaves the repository.
            self.dispatcher.submit(("storage", "forget"), STORAGE, self.forget_snapshots)
        # Our network isolation rules, repaired if a firewall reload dropped them.
        try:
            runtime.guard_networks()
        except GpuyardError as exc:
            log.warning("cannot re-apply network isolation on %s: %s", key, exc.message)

    def _recover_dead(
        self,
        live: dict[str, str],
        states: dict[str, ContainerState],
        listed_at: datetime,
        host_ids: tuple[int, ...],
    ) -> bool:
        """Recover each running cluster (of ``live``: id -> status) whose container the
        listing (``states``) shows dead or missing, unless the cluster was written
        since the listing (a start racing it). Whether any was found dead."""
        running = ClusterStatus.RUNNING.value
        alive = ContainerState.RUNNING
        dead = [
            cid for cid, status in live.items() if status == running and states.get(cid) != alive
        ]
        if not dead:
            return False
        host = host_ids[0] if host_ids else None
        with self.ctx.read() as session:
            for start in range(0, len(dead), 500):
                for cid in session.scalars(
                    select(Cluster.id).where(
                        Cluster.id.in_(dead[start : start + 500]),
                        Cluster.status == running,
                        Cluster.updated_at < listed_at,
                    )
                ):
                    self.dispatcher.submit_cluster(cid, self.recover, SLOW, host)
        return True

    def _collect_containers(
        self, key: str, host_ids: tuple[int, ...], unexpected: set[str], now: datetime
    ) -> None:
        """Containers of ours that no cluster should have (on this engine) are removed
        only once they have been seen so for the grace period (a create racing the
        listing, or a store briefly behind, never loses a container)."""
        grace = timedelta(seconds=self.ctx.settings.orphan_container_grace_s)
        for seen in [s for s in self._unknown_since if s[0] == key]:
            if seen[1] not in unexpected:
                del self._unknown_since[seen]
        host = host_ids[0] if host_ids and key != SHARED_ENGINE else None
        for cid in unexpected:
            first = self._unknown_since.setdefault((key, cid), now)
            if now - first >= grace:
                self.dispatcher.submit_cluster(
                    cid,
                    partial(self._collect_one, on_host=host),
                    URGENT,
                    host,
                    job_key=("collect", key, cid),
                )

    def _collect_one(self, cluster_id: str, *, on_host: int | None) -> None:
        self.collector.collect_container(cluster_id, on_host=on_host)

    def _sync_host_limits(self, runtime: Runtime, host_ids: tuple[int, ...]) -> None:
        """Show on the hosts whether their engine enforces CPU/memory limits and disk
        sizes (the runtime learns it from the engine's refusal or the host's probe), so
        creates can refuse with a clear error."""
        own = self.hosts.host_id
        ids = host_ids or ((own,) if own is not None else ())
        if not ids:
            return
        caps = runtime.capabilities()
        problem, disk = caps.limits_problem, caps.disk_problem
        wanted = (problem is None, problem, disk is None, disk)
        with self.ctx.read() as session:
            shown = list(
                session.execute(
                    select(
                        Host.id,
                        Host.enforces_limits,
                        Host.limits_note,
                        Host.enforces_disk,
                        Host.disk_note,
                    ).where(Host.id.in_(ids))
                )
            )
        stale = [
            r.id
            for r in shown
            if (r.enforces_limits, r.limits_note, r.enforces_disk, r.disk_note) != wanted
        ]
        if not stale:
            return  # the usual case: no write transaction every observe pass
        with self.ctx.transaction() as session:
            for host_id in stale:
                host = session.get(Host, host_id)
                if host is not None:
                    host.enforces_limits, host.limits_note = wanted[0], wanted[1]
                    host.enforces_disk, host.disk_note = wanted[2], wanted[3]
