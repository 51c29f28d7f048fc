"""Snapshots of volumes: their statuses, what they promise about consistency, and the
rules for when a volume may be saved or restored."""

from __future__ import annotations

from enum import StrEnum

from gpuyard.core.states import ClusterStatus


class SnapshotStatus(StrEnum):
    CREATING = "creating"
    READY = "ready"
    FAILED = "failed"


class Consistency(StrEnum):
    # Nothing had the volume mounted while it was read: exactly the data as left.
    STOPPED = "stopped"
    # Read while a container had it mounted: like a power cut at some instant per
    # file; applications that survive a crash recover from it.
    CRASH_CONSISTENT = "crash_consistent"


class SnapshotFormat(StrEnum):
    # The volume's tar stream as one file (read through any engine's API): taken where
    # restic cannot run beside the volume (a remote engine, an S3 repository).
    TAR = "tar"
    # The volume's files themselves under /data, taken by restic beside the volume (in
    # a helper that reaches the repository only over REST); restored by restic restore
    # in a helper, or elsewhere as a tar rebuilt from the snapshot.
    TREE = "tree"


class SnapshotRepository(StrEnum):
    """Which restic repository holds a snapshot's data (``snapshots.repository``).
    NULL there: the installation-wide repository of earlier versions, read only to
    move its snapshots into their accounts' repositories at start-up."""

    # The snapshot's account's own repository, with its own password.
    ACCOUNT = "account"


class RestoreStatus(StrEnum):
    RESTORING = "restoring"
    DONE = "done"
    FAILED = "failed"


# A container of the cluster may be using the volume in these statuses.
MOUNTED_STATUSES = frozenset(
    {
        ClusterStatus.PENDING,
        ClusterStatus.STARTING,
        ClusterStatus.RUNNING,
        ClusterStatus.STOPPING,
    }
)
# A cluster's volume can be read in these statuses (not while it is terminating or
# gone, nor before its first start created it... which ``starting`` may still do).
SNAPSHOTTABLE_STATUSES = frozenset(
    {ClusterStatus.RUNNING, ClusterStatus.STOPPED, ClusterStatus.ERROR}
)


def consistency_for(statuses: set[ClusterStatus]) -> Consistency:
    """The consistency of a snapshot of a volume mounted by clusters in ``statuses``."""
    if statuses & MOUNTED_STATUSES:
        return Consistency.CRASH_CONSISTENT
    return Consistency.STOPPED


def percentage(done: int, total: int) -> int:
    """Progress as a whole percentage that never reaches 100 before the end."""
    if total <= 0:
        return 0
    return max(0, min(99, done * 100 // total))
