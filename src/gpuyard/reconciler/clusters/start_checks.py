"""What a start must know before it touches the engine, read in one transaction.

Four questions, each a read of its own before: whether another cluster still stops on
this cluster's GPUs, whether a snapshot still reads its volume, whether its volume is
to be moved here first, whether a snapshot is to be restored into it. On PostgreSQL
each read was a round trip of its own (and a connection taken from the pool and given
back); asked together they are one. The answers are the same: all four are reads, and
the start acts on them in the same order as before.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpuyard.core.states import ClusterStatus
from gpuyard.services.clusters.moves import pending_move_in
from gpuyard.services.context import Context
from gpuyard.services.volumes.snapshot_work import snapshot_reading_in
from gpuyard.services.volumes.snapshots import pending_restore_in
from gpuyard.store.schema import Cluster, VolumeMove, VolumeRestore


@dataclass(frozen=True)
class StartChecks:
    """The answers, as rows detached from the session that read them."""

    # Another cluster on this host is still stopping on one of this cluster's GPUs.
    gpus_held: bool
    # A snapshot of the cluster's volume (or of the network volume it mounts) is
    # still being taken.
    snapshot_reading: bool
    # The move of the cluster's volume to its new host, when its data is not there yet.
    move: VolumeMove | None
    # The restore of a snapshot into the cluster's volume, when not done yet.
    restore: VolumeRestore | None


def gpus_held_in(session: Session, c: Cluster) -> bool:
    """Whether another cluster on ``c``'s host, still stopping, holds one of its GPUs."""
    if not c.gpu_indices or c.host_id is None:
        return False
    mine = set(c.gpu_indices)
    leaving = session.scalars(
        select(Cluster.gpu_indices).where(
            Cluster.host_id == c.host_id,
            Cluster.status == ClusterStatus.STOPPING.value,
            Cluster.id != c.id,
        )
    )
    return any(mine & set(indices) for indices in leaving)


def read_start_checks(ctx: Context, c: Cluster) -> StartChecks:
    """The four answers for ``c``, in one read transaction. A cluster whose GPUs are
    still held is told so alone (the start waits; the rest is asked again then)."""
    with ctx.read() as session:
        if gpus_held_in(session, c):
            return StartChecks(gpus_held=True, snapshot_reading=False, move=None, restore=None)
        reading = snapshot_reading_in(session, c)
        move = pending_move_in(session, c.id)
        restore = pending_restore_in(session, c.id)
        for row in (move, restore):
            if row is not None:
                session.expunge(row)
    return StartChecks(gpus_held=False, snapshot_reading=reading, move=move, restore=restore)
