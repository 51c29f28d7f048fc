"""Whether a training cluster has work: Slurm's queue, asked of its controller.

A training cluster is idle (for auto-termination) while no job runs or waits in its
queue. ``SqueueJobs`` asks the controller node (``squeue``) through the node runtime of
the controller's host; the watcher takes any :class:`SlurmJobs`, so tests give it a
fake queue.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from gpuyard.core.errors import RuntimeFailure

# Job states (squeue's long names) that count as work: a job that runs, waits for
# nodes, or is between the two (starting, ending, requeued). A suspended job holds no
# CPU and does not keep a cluster busy; finished jobs are not listed.
ACTIVE_STATES = frozenset(
    {
        "PENDING",
        "RUNNING",
        "CONFIGURING",
        "COMPLETING",
        "REQUEUED",
        "REQUEUE_HOLD",
        "REQUEUE_FED",
        "RESIZING",
        "SIGNALING",
        "STAGE_OUT",
    }
)
SQUEUE = ["squeue", "-h", "-o", "%T"]
SQUEUE_TIMEOUT_S = 10.0


class SlurmJobs(Protocol):
    def active_jobs(self, host_id: int | None, controller: str) -> int:
        """How many jobs run or wait on the controller ``controller`` (a node on host
        ``host_id``). Raises when the queue cannot be read."""
        ...


class Exec(Protocol):
    def exec(self, name: str, argv: list[str], timeout_s: float = 30) -> tuple[int, str]: ...


def count_active(squeue_output: str) -> int:
    """The jobs of ``squeue -h -o %T`` output (one state per line) that count as work."""
    return sum(1 for line in squeue_output.splitlines() if line.strip().upper() in ACTIVE_STATES)


class SqueueJobs:
    """Reads the queue with ``squeue`` run in the controller's container, on the engine
    of its host (``on_host``: the training operator's)."""

    def __init__(self, on_host: Callable[[int | None], Exec]) -> None:
        self.on_host = on_host

    def active_jobs(self, host_id: int | None, controller: str) -> int:
        code, out = self.on_host(host_id).exec(controller, SQUEUE, timeout_s=SQUEUE_TIMEOUT_S)
        if code != 0:
            raise RuntimeFailure(
                f"squeue on {controller} failed (exit {code}): {out.strip()[-200:]}",
                {"node": controller},
            )
        return count_active(out)
