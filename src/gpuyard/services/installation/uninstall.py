"""Removing an installation for good (``gpuyard uninstall``).

What is removed is exactly what carries this installation's id (DESIGN.md rule 8), on
every engine it knows: this machine's and each host in its database. Per host:
containers (forcefully, running or not), the overlay state of its networks (VXLAN
interface and nft table, named after the network), its networks, its volumes only when
asked, and the host firewall chains named after the installation (the isolation chain
and the training edge's nat/filter chains, with their jumps). Rules shared by every
installation on a host (the loopback guard, the overlay port guard) stay: another
installation may rely on them, and they let nothing through.

Each host is worked on apart: one that does not answer is reported with its error and
the others are still cleaned. Nothing here reads or writes the database; the caller
lists the hosts (:func:`known_hosts`) and decides whether the server is running.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from sqlalchemy import inspect, select

from gpuyard.core.errors import GpuyardError
from gpuyard.core.ownership import Ownership
from gpuyard.runtimes.engines.engine import Engine, EngineVolume
from gpuyard.runtimes.hosts.edge import EdgeUnavailable, installation_chains
from gpuyard.runtimes.hosts.firewall import IptablesIsolation, IsolationUnavailable
from gpuyard.runtimes.slurm.overlay import detach_script, run_script
from gpuyard.store.db import make_engine
from gpuyard.store.schema import Host, Installation


@dataclass(frozen=True)
class KnownHost:
    """A remote host of the installation: its name, engine URL and TLS material."""

    name: str
    engine_url: str
    tls_dir: str | None = None


@dataclass
class HostRemoval:
    """What was removed on one host (names), and why it stopped if it did."""

    host: str
    containers: list[str] = field(default_factory=list)
    networks: list[str] = field(default_factory=list)
    volumes: list[str] = field(default_factory=list)
    volumes_kept: list[str] = field(default_factory=list)
    firewall_chains: list[str] = field(default_factory=list)
    error: str | None = None

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def installation_of(database_url: str) -> tuple[Ownership, list[KnownHost]]:
    """The installation in the database at ``database_url`` and its remote hosts
    (those with an engine URL other than this machine's). Raises GpuyardError when the
    database holds no installation."""
    engine = make_engine(database_url)
    try:
        with engine.connect() as conn:
            if not inspect(conn).has_table(Installation.__tablename__):
                raise GpuyardError("the database holds no installation: nothing to remove")
            found = conn.execute(
                select(Installation.uuid).order_by(Installation.id).limit(1)
            ).scalar()
            if found is None:
                raise GpuyardError("the database holds no installation: nothing to remove")
            rows = conn.execute(
                select(Host.name, Host.engine_url, Host.engine_tls_dir)
                .where(Host.is_local.is_(False), Host.engine_url.is_not(None))
                .order_by(Host.id)
            ).all()
    finally:
        engine.dispose()
    return Ownership(str(found)), [KnownHost(str(n), str(u), t) for n, u, t in rows]


def owned_volumes(engine: Engine) -> list[EngineVolume]:
    """This installation's volumes on ``engine`` (with sizes where the engine says).
    Raises RuntimeFailure when the engine does not answer."""
    return engine.list_volumes()


def remove_from(host: str, engine: Engine, *, delete_volumes: bool) -> HostRemoval:
    """Remove everything of ``engine``'s bound installation there (see the module
    docstring); never raises for an engine or firewall failure: it is the result's
    ``error`` (what was removed before it stays listed)."""
    done = HostRemoval(host)
    try:
        _remove(engine, done, delete_volumes)
    except (GpuyardError, EdgeUnavailable, IsolationUnavailable) as exc:
        done.error = exc.message if isinstance(exc, GpuyardError) else str(exc)
    return done


def _remove(engine: Engine, done: HostRemoval, delete_volumes: bool) -> None:
    for row in engine.list_containers():
        names = row.get("Names") or [str(row.get("Id"))]
        name = str(names[0]).lstrip("/")
        engine.remove_container(str(row.get("Id")), checked=True)
        done.containers.append(name)
    runner = engine.host_runner
    for network in engine.list_networks():
        if runner is not None:
            run_script(runner, detach_script(network.name), f"removing {network.name}'s overlay")
        engine.remove_network(network.name)
        done.networks.append(network.name)
    for volume in engine.list_volumes():
        if delete_volumes:
            engine.remove_volume(volume.name)
            done.volumes.append(volume.name)
        else:
            done.volumes_kept.append(volume.name)
    if engine.manage_host_firewall and runner is not None:
        done.firewall_chains += _remove_chains(engine)


def _remove_chains(engine: Engine) -> list[str]:
    """Delete the installation's firewall chains and their jumps; the names of the
    installation-wide chains that were there."""
    short = engine.owner.short
    runner = engine.host_runner
    assert runner is not None
    isolation = engine.firewall or IptablesIsolation(short, runner=runner, iptables="iptables")
    wanted = [("filter", isolation.chain)]
    wanted += [(t, c) for c in installation_chains(short) for t in ("nat", "filter")]
    present = [
        f"{table}/{chain}"
        for table, chain in wanted
        if runner(["iptables", "-w", "5", "-t", table, "-S", chain]).returncode == 0
    ]
    isolation.remove()
    edge = engine.host_edge()
    if edge is not None:
        edge.uninstall()
    return present


def uninstall_hosts(
    targets: list[tuple[str, Callable[[], Engine]]], owner: Ownership, *, delete_volumes: bool
) -> list[HostRemoval]:
    """Clean every host in ``targets`` (name, how to reach its engine) for ``owner``;
    a host whose engine cannot even be made is reported with its error."""
    out: list[HostRemoval] = []
    for name, connect in targets:
        try:
            engine = connect()
            engine.bind(owner)
        except GpuyardError as exc:
            out.append(HostRemoval(name, error=exc.message))
            continue
        out.append(remove_from(name, engine, delete_volumes=delete_volumes))
    return out
