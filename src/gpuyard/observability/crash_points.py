"""Test-only fault injection: kill this process at a named point.

``GPUYARD_CRASH_AT=<point>`` in the server's environment makes the first arrival at
:func:`crash_point` with that name send SIGKILL to the own process: no ``finally``
block, no shutdown hook and no open transaction gets to finish, exactly as with a
power cut or the OOM killer. The crash-point end-to-end tests
(tests/e2e/test_crash_points_e2e.py) start the server with the variable, make it reach
the point, start it again without the variable and check that it converges.

The variable is read once, at import: with it unset (every real installation) a call
is one comparison against ``None``. Every name a call uses must be in
:data:`CRASH_POINTS` (a unit test checks the source both ways).
"""

from __future__ import annotations

import os
import signal

ENV_VAR = "GPUYARD_CRASH_AT"

# Every crash point, with where it is. Names are ``<operation>.<moment>``.
CRASH_POINTS: dict[str, str] = {
    "create.after_row": "cluster create: row committed, reconciler not yet woken",
    "create.idempotent_after_row": "create with an Idempotency-Key: row and key committed, "
    "no answer sent",
    "start.after_request": "start of a stopped cluster: starting committed (GPUs "
    "claimed), reconciler not yet woken",
    "start.pending_before_start": "start requested while stopping: the stop is done "
    "(cluster stopped, desired running), the kept start not yet made",
    "start.after_image": "start: image present, no container yet",
    "start.after_container_create": "start: container created, its id not recorded",
    "start.after_create_recorded": "start: container id recorded; the engine's start of "
    "the container asked for at the same moment (started or not)",
    "start.after_container_start": "start: container started, not yet seen running",
    "start.after_running": "start: cluster running, a moved volume's old copy not deleted",
    "start.move.after_copy": "start on a new host: volume copied, the move not recorded",
    "start.move.after_recorded": "start on a new host: move recorded, container not created",
    "start.restore.after_restoring_step": "start with a restore: restoring recorded, "
    "nothing unpacked",
    "start.restore.after_unpack": "start with a restore: snapshot unpacked into the new "
    "volume, not swapped in",
    "start.restore.after_swap": "start with a restore: new volume swapped in, old volume "
    "not removed",
    "stop.after_request": "stop: stopping committed, reconciler not yet woken",
    "stop.after_container_stop": "stop: container stopped, cluster not yet stopped, GPUs held",
    "terminate.after_request": "terminate: terminating committed, reconciler not yet woken",
    "terminate.after_container_stop": "terminate: container removed, volume not",
    "terminate.after_volume_remove": "terminate: volume removed, cluster not terminated, GPUs held",
    "snapshot.after_request": "snapshot: row committed (creating), reconciler not woken",
    "snapshot.after_claim": "snapshot: claimed by this worker, nothing read",
    "snapshot.after_upload": "snapshot: data in the repository, row still creating",
    "restore.network_volume.after_unpack": "network volume restore: unpacked, not swapped",
    "restore.network_volume.after_swap": "network volume restore: swapped, old engine "
    "volume not removed",
    "network_volume.create.after_row": "network volume create: row and disk committed, "
    "no answer sent",
    "network_volume.delete.after_row": "network volume delete: deleted row committed, "
    "engine volume not removed",
    "network_volume.delete.after_engine_remove": "network volume delete: engine volume "
    "removed, its disk not released",
    "training.create.after_row": "training create: rows committed, reconciler not woken",
    "training.build.after_node_create": "training build: a node container created, its "
    "id not recorded",
    "training.scale.after_request": "training scale: new node rows committed, not built",
    "training.delete.after_request": "training delete: deleting committed, nodes not removed",
    "training.teardown.after_nodes_removed": "training delete: nodes removed, rows not finished",
    "drain.after_cordon": "drain: host draining committed, no cluster stopped or moved",
    "drain.after_resting_move": "drain of a stopped cluster: volume moved and recorded, "
    "old copy not deleted",
    "budget.stop.after_first_stop": "budget stop: the first of an account's clusters "
    "stopping, the others not yet",
}

_ARMED = os.environ.get(ENV_VAR) or None


def crash_point(name: str) -> None:
    """SIGKILL this process if ``GPUYARD_CRASH_AT`` names ``name`` (test-only)."""
    if _ARMED is not None and name == _ARMED:
        os.kill(os.getpid(), signal.SIGKILL)
