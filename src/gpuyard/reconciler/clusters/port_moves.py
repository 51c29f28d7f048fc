"""A cluster's host ports move off ports that something else on the host holds.

gpuyard's port claims (``PortAllocation``) only know gpuyard's own clusters. Another
installation on the same engine, any program, a port published outside gpuyard may hold
a port of ``GPUYARD_PORT_RANGE_START..END`` too. So a start asks the host first
(Runtime.host_ports_in_use) and, should the engine still meet "address already in use"
(a program bound the port after the question), asks again with that port added:

- a port gpuyard chose (``external_port`` 0) moves to the next port free in both the
  claims and the host's answer, in one short transaction under the placement lock; the
  cluster's events say which port it left and which it got (``port_moved``), and its
  ``network`` shows the new one;
- a port the user chose fails the start at once with PORT_IN_USE naming it: it is the
  user's choice, and no retry would free it.

The host's answer is asked outside any transaction: it is a round trip to the engine
and, for a remote host, an SSH command.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpuyard.core.errors import InsufficientCapacity, PortInUse
from gpuyard.core.models import PortSpec
from gpuyard.services.access.port_rules import server_ports
from gpuyard.services.capacity.placement import lock_placement
from gpuyard.services.clusters.config import HOST_PORT, ports_of
from gpuyard.services.clusters.lifecycle import guarded_update, record_event
from gpuyard.services.context import Context
from gpuyard.store.schema import Cluster, PortAllocation

HostPort = tuple[int, str]

# How often one start pass moves on after "address already in use" before it gives the
# failure to the ordinary start retries (each move asks the host again).
MOVES_PER_START = 5

# Podman: "cannot listen on the TCP port: listen tcp4 :20000: bind: address already in
# use" (rootless), "listen tcp 0.0.0.0:20000: bind: address already in use"; Docker:
# "Bind for 0.0.0.0:20000 failed: port is already allocated".
_LISTEN = re.compile(r"listen (tcp|udp)\w*\s+\S*?:(\d+): bind: address already in use")
_DOCKER = re.compile(r"Bind for \S*?:(\d+) failed: port is already allocated")


def port_in_use(message: str) -> HostPort | None:
    """The host port an engine's start failure says is taken, or None."""
    match = _LISTEN.search(message)
    if match:
        return int(match.group(2)), match.group(1)
    match = _DOCKER.search(message)
    return (int(match.group(1)), "tcp") if match else None


def move_off(ctx: Context, c: Cluster, busy: frozenset[HostPort], now: datetime) -> bool:
    """Move ``c``'s host ports that lie in ``busy`` to free ones (module docstring).
    Returns whether any moved; updates ``c.version`` and ``c.ports``. Raises PortInUse
    for a port the user chose, InsufficientCapacity when the range has no free port
    left, Conflict when the cluster changed meanwhile."""
    if not _holds_any(c, busy):
        # The usual answer, found without a write transaction: the cluster's row
        # carries the host port of each of its claims (written with them).
        return False
    with ctx.transaction() as session:
        mine = select(PortAllocation).where(PortAllocation.cluster_id == c.id)
        rows = list(session.scalars(mine))
        hit = [r for r in rows if (r.port, r.protocol) in busy]
        if not hit:
            return False
        declared: dict[HostPort, PortSpec] = {
            (s.internal_port, s.transport): s for s in ports_of(c)
        }
        for r in hit:
            spec = declared.get((r.internal_port, r.protocol))
            if spec is not None and spec.external_port:
                raise PortInUse(
                    f"host port {r.port}/{r.protocol} (the external_port chosen for port "
                    f"{r.internal_port}) is in use on the host; choose another, or 0 to "
                    "let gpuyard assign one",
                    {"external_port": r.port, "internal_port": r.internal_port},
                )
        moves = _reassign(session, ctx, c, hit, busy)
        ports = _with_moves(c.ports, moves)
        c.version = guarded_update(session, c.id, c.version, now, ports=ports)
        c.ports = ports
        for (internal, transport), (old, new) in moves.items():
            record_event(
                session,
                c.id,
                now,
                "port_moved",
                f"host port {old}/{transport} is in use on the host; port "
                f"{internal}/{transport} got host port {new} instead",
            )
    ctx.notifier.notify()  # the HTTP proxy's routes follow the new port
    return True


def _holds_any(c: Cluster, busy: frozenset[HostPort]) -> bool:
    """Whether one of ``c``'s host ports (as its row records them) lies in ``busy``;
    True also for a row that does not say (the claims are then read)."""
    if not busy:
        return False
    for item in c.ports or []:
        port = item.get(HOST_PORT)
        if not isinstance(port, int):
            return True
        if (port, "udp" if item.get("protocol") == "udp" else "tcp") in busy:
            return True
    return False


def _reassign(
    session: Session,
    ctx: Context,
    c: Cluster,
    hit: list[PortAllocation],
    busy: frozenset[HostPort],
) -> dict[tuple[int, str], tuple[int, int]]:
    """Give each claim in ``hit`` the lowest port of the range free in the claims (on
    the host, any cluster's) and in ``busy``; ``(internal, transport) -> (old, new)``."""
    lock_placement(session)
    host_id = hit[0].host_id
    taken = set(busy) | {
        (port, protocol)
        for port, protocol in session.execute(
            select(PortAllocation.port, PortAllocation.protocol).where(
                PortAllocation.host_id == host_id
            )
        )
    }
    low, high = ctx.settings.port_range_start, ctx.settings.port_range_end
    reserved = server_ports(ctx.settings)
    moves: dict[tuple[int, str], tuple[int, int]] = {}
    for r in hit:
        new = next(
            (p for p in range(low, high + 1) if p not in reserved and (p, r.protocol) not in taken),
            0,
        )
        if not new:
            raise InsufficientCapacity(
                f"no free host port left in the configured range {low}-{high} "
                f"(port {r.port}/{r.protocol} is in use on the host)"
            )
        taken.add((new, r.protocol))
        moves[(r.internal_port, r.protocol)] = (r.port, new)
        r.port = new
    session.flush()
    return moves


def _with_moves(stored: list[Any], moves: dict[tuple[int, str], tuple[int, int]]) -> list[Any]:
    """The cluster's ports JSON with the moved host ports."""
    out = []
    for item in stored:
        transport = "udp" if item.get("protocol") == "udp" else "tcp"
        move = moves.get((item["internal_port"], transport))
        out.append({**item, HOST_PORT: move[1]} if move else dict(item))
    return out
