"""Collection of containers of ours that no cluster should have: removed (a cluster
that moved or rests), or quarantined when the database never knew the cluster."""

from __future__ import annotations

import logging
from collections.abc import Callable

from gpuyard.core.states import MAY_HAVE_CONTAINER, ClusterStatus
from gpuyard.reconciler.clusters.records import ClusterRecords
from gpuyard.runtimes.base import ContainerState, Runtime
from gpuyard.services.clusters.lifecycle import record_event
from gpuyard.services.context import Context

log = logging.getLogger(__name__)


class ContainerCollector:
    """Removes or quarantines stray containers on the engine of a host (``runtime_of``)."""

    def __init__(
        self,
        ctx: Context,
        records: ClusterRecords,
        runtime_of: Callable[[int | None], Runtime],
    ) -> None:
        self.ctx = ctx
        self.records = records
        self.runtime_of = runtime_of

    def _quarantine_container(self, cluster_id: str, on_host: int | None) -> None:
        """Stop (never remove) a running container of ours whose cluster the database
        does not know; one already stopped is left as it is."""
        runtime = self.runtime_of(on_host if on_host is not None else None)
        if runtime.observe(cluster_id).state != ContainerState.RUNNING:
            return
        log.warning(
            "stopping (not removing) container of cluster %s: the database does not know "
            "it (restored from an older backup?)",
            cluster_id,
        )
        runtime.halt(cluster_id, timeout_s=self.ctx.settings.stop_timeout_s)
        with self.ctx.transaction() as session:
            record_event(
                session,
                cluster_id,
                self.ctx.clock.now(),
                "quarantined",
                "stopped (and kept, with its disk and volume) a container of this "
                "installation that no cluster in the database knows; its volume is "
                "listed in the orphans",
            )

    def collect_container(self, cluster_id: str, on_host: int | None = None) -> None:
        """Remove the container of ours that a cluster should not have (the reconciler
        calls this only after the grace period), and say so in the cluster's events.
        ``on_host``: the host whose engine holds it (None: the one engine of every
        host); a cluster that now lives on another host (it moved) should not have it
        here. The container of a cluster the database has never known (one made after
        the backup it was restored from) is quarantined instead: stopped, so its GPUs
        are not used twice, and kept with its disk and volume for an admin."""
        c = self.records.load(cluster_id)
        here = on_host is None or (c is not None and c.host_id == on_host)
        if c is not None and here and ClusterStatus(c.status) in MAY_HAVE_CONTAINER:
            return
        if c is None:
            self._quarantine_container(cluster_id, on_host)
            return
        log.info("removing container of cluster %s: no cluster of ours should have it", cluster_id)
        runtime = self.runtime_of(on_host if on_host is not None else None)
        runtime.stop(cluster_id, timeout_s=self.ctx.settings.stop_timeout_s)
        with self.ctx.transaction() as session:
            record_event(
                session,
                cluster_id,
                self.ctx.clock.now(),
                "collected",
                "removed a container of this installation that "
                + (
                    "no cluster in the database knows"
                    if c is None
                    else f"a {c.status} cluster should not have"
                    if here
                    else f"was left on host {on_host} (the cluster runs on host {c.host_id})"
                ),
            )
