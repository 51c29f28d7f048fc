"""The hosts the reconciler drives, as last read from the store: how to reach each
one's engine, which are another replica's own machine, and the engines they share."""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import select

from gpuyard.runtimes.base import Runtime
from gpuyard.runtimes.fleet import SHARED_ENGINE, Fleet, HostEngine
from gpuyard.services.context import Context
from gpuyard.store.schema import Host


class HostDirectory:
    """The fleet's host lookup (``host_engine``), refreshed every pass that looks at
    engines. ``host_id``: the host this server runs on (None: the first host)."""

    def __init__(self, ctx: Context, fleet: Fleet, host_id: int | None = None) -> None:
        self.ctx = ctx
        self.fleet = fleet
        self._host_id = host_id
        # Hosts as last read from the store (engine URL, status).
        self.hosts: dict[int, HostEngine] = {}
        # Other replicas' own machines: driven by them, never from here.
        self.foreign: set[int] = set()

    @property
    def host_id(self) -> int | None:
        """The host this server runs on (the first host if not set)."""
        if self._host_id is None:
            with self.ctx.read() as session:
                self._host_id = session.scalar(
                    select(Host.id).order_by(Host.is_local.desc(), Host.id).limit(1)
                )
        return self._host_id

    def refresh(self) -> dict[int, HostEngine]:
        """Re-read every host's engine address from the store."""
        own = self.host_id
        with self.ctx.read() as session:
            rows = list(
                session.execute(
                    select(Host.id, Host.name, Host.engine_url, Host.engine_tls_dir, Host.is_local)
                )
            )
        # Another replica's own machine is driven by that replica (its engine URL is a
        # socket on that machine), never from here.
        self.foreign = {r.id for r in rows if r.is_local and r.id != own}
        hosts = {
            r.id: HostEngine(r.id, r.name, r.engine_url, r.engine_tls_dir, r.id == own)
            for r in rows
            if r.id not in self.foreign
        }
        gone = set(self.hosts) - set(hosts)
        self.hosts = hosts
        for host_id in gone:
            self.fleet.forget(host_id)
        return hosts

    def host_engine(self, host_id: int) -> HostEngine | None:
        """How to reach ``host_id`` (the fleet's lookup)."""
        found = self.hosts.get(host_id)
        if found is None:
            found = self.refresh().get(host_id)
        return found

    def engines(self) -> list[tuple[str, tuple[int, ...]]]:
        """The engines of every host (one shared engine without a factory): (engine
        key, the host ids it serves)."""
        engines = self.fleet.engines(self.refresh().values())
        return engines or [(SHARED_ENGINE, ())]

    def runtime_of(self, host_ids: Iterable[int]) -> Runtime:
        """The runtime of the engine serving ``host_ids`` (the shared one for none)."""
        return self.fleet.for_host(next(iter(host_ids), None))
