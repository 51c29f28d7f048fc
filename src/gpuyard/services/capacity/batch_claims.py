"""Claims for a batch of new clusters, decided in memory and written at once.

The placer's batch writers (services/capacity/placement_batch.py) place many new
clusters in one locked transaction. Doing each claim as services/capacity/placement.py
``claim`` does (read the candidate hosts exactly, insert the GPU and reservation rows,
flush) costs a few statements a create; here a host is read exactly once per batch:

- the per-process free-capacity hint (services/capacity/fleet_hint.py) names the
  candidates, as for a single claim; a candidate not yet read in this transaction is
  read exactly (with a few more of the hint's next picks at once), the hint corrected
  from it and asked again, until the hint's best hosts are all exact;
- a host read exactly in this locked transaction stays exact: only claims take
  capacity, every claim takes the placement lock first, and this batch's own claims
  are applied to the figures (and the hint) as they are made. Releases committed by
  other transactions meanwhile only free capacity: the figures err on the full side;
- a claim is decided by the pure core/placement.py ``place`` over those figures, and
  taken (:meth:`BatchClaims.take`) only once the caller's other checks passed, so a
  refused create changes nothing here;
- the GPU, reservation and port rows are written per table in one multi-row insert
  (:meth:`BatchClaims.write`), inside the batch's transaction. The unique keys on GPU
  and port rows stay the backstop: a clash fails the insert, and the placer then runs
  the batch's creates one by one instead.

Anything this cannot decide exactly as ``claim`` would (a pinned host, CUDA
constraints, a fleet the hint has nothing for, spot preemption when nothing is free)
raises InsufficientCapacity: the caller hands that create to the one-by-one path, which
answers it as before.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpuyard.core.errors import InsufficientCapacity, ValidationFailed
from gpuyard.core.fleet import PlacementPolicy
from gpuyard.core.models import HostCapacity, Placement, PortSpec, ResourceRequest
from gpuyard.core.placement import AllocationRatios, place
from gpuyard.services.capacity.candidates import CANDIDATES, asks_cuda
from gpuyard.services.capacity.fleet_hint import hint_for
from gpuyard.services.capacity.placement import (
    BATCH_TOUCHED,
    free_port,
    lock_placement,
    ready_hint,
)
from gpuyard.services.fleet.hosts import HostRow, exact_hosts
from gpuyard.store.bulk import insert_rows
from gpuyard.store.schema import GpuAllocation, PortAllocation, Reservation

# How many of the hint's picks are read exactly at once: the creates that follow land
# there (the next hosts binpack fills, or those spread takes in turn).
_READ_AHEAD = 2 * CANDIDATES
# Rounds of "read the unknown candidates, ask the hint again" before giving up.
_ROUNDS = 4


# The columns of a host that a new cluster's own checks read
# (services/clusters/host_checks.py, the meter's billing pause).
HostFacts = HostRow


@dataclass(frozen=True)
class Choice:
    """A decided claim, not yet taken: where, and what it asks of the host."""

    cluster_id: str
    placement: Placement
    request: ResourceRequest
    volume_gb: int
    ratios: AllocationRatios


class BatchClaims:
    """The claims of one batch (see the module docstring). Lives for one transaction,
    used by one thread."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.hint = hint_for(session)
        self._exact: dict[int, HostCapacity] = {}
        self._facts: dict[int, HostFacts] = {}
        self._taken_ports: dict[int, set[tuple[int, str]]] = {}
        self._ready = False
        self._gpus: list[dict[str, Any]] = []
        self._reservations: list[dict[str, Any]] = []
        self._ports: list[dict[str, Any]] = []

    # ------------------------------------------------------------ deciding

    def choose(
        self,
        *,
        cluster_id: str,
        request: ResourceRequest,
        volume_gb: int,
        ratios: AllocationRatios,
        policy: PlacementPolicy,
        now: datetime,
    ) -> Choice:
        """Where a new cluster asking ``request`` (and a volume of ``volume_gb``) goes,
        as services/capacity/placement.py ``claim`` decides it for a fresh cluster on
        no pinned host. Raises InsufficientCapacity when it fits nowhere known here
        (the caller hands the create to the one-by-one path, which says why)."""
        if asks_cuda(request) or request.location is not None:
            raise InsufficientCapacity("decided one by one")
        sized = replace(request, disk_gb=request.disk_gb + volume_gb)
        hosts = self._candidates(sized, ratios, policy, now)
        placement = place(hosts, sized, ratios, policy)
        return Choice(cluster_id, placement, request, volume_gb, ratios)

    def _candidates(
        self,
        req: ResourceRequest,
        ratios: AllocationRatios,
        policy: PlacementPolicy,
        now: datetime,
    ) -> list[HostCapacity]:
        if not self._ready:
            lock_placement(self.session)
            ready_hint(self.session, self.hint, ratios, now)
            self._ready = True
        for _ in range(_ROUNDS):
            ids = self.hint.pick(req, policy, (), CANDIDATES)
            if not ids:
                break
            if all(i in self._exact for i in ids):
                return [self._exact[i] for i in ids]
            # Read the hint's next few picks too: the following creates land there.
            ahead = self.hint.pick(req, policy, (), _READ_AHEAD)
            self._read([i for i in ahead if i not in self._exact], ratios)
        raise InsufficientCapacity("decided one by one")

    def _read(self, host_ids: list[int], ratios: AllocationRatios) -> None:
        exact = exact_hosts(self.session, host_ids)
        for cap, facts in exact:
            self._exact[cap.host_id] = cap
            self._facts[cap.host_id] = facts
        self.hint.update([cap for cap, _ in exact], ratios)

    def host(self, host_id: int) -> HostFacts | None:
        """What a new cluster's checks read of host ``host_id`` (read with its
        figures, once a batch)."""
        return self._facts.get(host_id)

    def ports(
        self,
        host_id: int,
        specs: tuple[PortSpec, ...],
        port_range: tuple[int, int],
        reserved: frozenset[int],
    ) -> dict[tuple[int, str], int]:
        """Host ports for a new cluster's ``specs`` on ``host_id``, as
        services/capacity/placement.py ``assign_ports`` chooses them; only ports
        gpuyard chooses (a port the user names is asked of the host: one by one).
        Raises ValidationFailed / InsufficientCapacity as it does."""
        result: dict[tuple[int, str], int] = {}
        if not specs:
            return result
        taken = set(self._taken(host_id))
        for spec in specs:
            key = (spec.internal_port, spec.transport)
            if spec.external_port or key in result:
                raise ValidationFailed("ports", "decided one by one")
            port = free_port(taken, spec.transport, port_range, reserved)
            if not port:
                raise InsufficientCapacity("no free host port left in the configured range")
            taken.add((port, spec.transport))
            result[key] = port
        return result

    def _taken(self, host_id: int) -> set[tuple[int, str]]:
        taken = self._taken_ports.get(host_id)
        if taken is None:
            rows = self.session.execute(
                select(PortAllocation.port, PortAllocation.protocol).where(
                    PortAllocation.host_id == host_id
                )
            )
            taken = self._taken_ports[host_id] = {(r.port, r.protocol) for r in rows}
        return taken

    # ------------------------------------------------------------ taking

    def take(self, choice: Choice, ports: dict[tuple[int, str], int]) -> None:
        """Make ``choice`` (and its host ``ports``) part of the batch: its rows are
        written by :meth:`write`, the figures and the hint count it from now on."""
        p, req = choice.placement, choice.request
        before = self._exact[p.host_id]
        after = replace(
            before,
            used_gpu_indices=before.used_gpu_indices | set(p.gpu_indices),
            used_vcpus=before.used_vcpus + req.vcpus,
            used_memory_gb=before.used_memory_gb + req.memory_gb,
            used_disk_gb=before.used_disk_gb + req.disk_gb + choice.volume_gb,
        )
        self._exact[p.host_id] = after
        self.hint.update([after], choice.ratios)
        touched = self.session.info.get(BATCH_TOUCHED)
        if touched is not None:
            # Read again if the batch's SAVEPOINT rolls back (the placer sees to it).
            touched.add(p.host_id)
        self._gpus.extend(
            {"host_id": p.host_id, "gpu_index": i, "cluster_id": choice.cluster_id}
            for i in p.gpu_indices
        )
        self._reservations.append(
            {
                "cluster_id": choice.cluster_id,
                "host_id": p.host_id,
                "vcpus": req.vcpus,
                "memory_gb": req.memory_gb,
                "container_disk_gb": req.disk_gb,
                "volume_gb": choice.volume_gb,
            }
        )
        taken = self._taken(p.host_id) if ports else set()
        for (internal, transport), port in ports.items():
            taken.add((port, transport))
            self._ports.append(
                {
                    "host_id": p.host_id,
                    "port": port,
                    "protocol": transport,
                    "cluster_id": choice.cluster_id,
                    "internal_port": internal,
                }
            )

    def write(self) -> None:
        """Insert the taken claims' rows, one statement per table (the clusters they
        name must be rows already). Core statements: no ORM bulk work per row."""
        conn = self.session.connection()
        for table, rows in (
            (GpuAllocation, self._gpus),
            (Reservation, self._reservations),
            (PortAllocation, self._ports),
        ):
            insert_rows(conn, table, rows)
