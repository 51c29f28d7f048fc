"""Slurm as the controller sees it, through ``scontrol`` and ``sinfo`` run in the
controller's container: the nodes it knows, drains and resumes of workers, and the
wait for restarted workers to register anew."""

from __future__ import annotations

import logging
import time

from gpuyard.core.errors import GpuyardError
from gpuyard.reconciler.training.nodes import NodeRuntime

log = logging.getLogger(__name__)

# Slurm's drain reason for a worker update_image is replacing.
DRAIN_REASON = "update_image"


def slurm_nodes(nodes: NodeRuntime, controller: str) -> dict[str, dict[str, str]]:
    """Each node's ``scontrol show node`` fields (first word of each value) as the
    controller knows them ({} when it does not answer)."""
    try:
        code, out = nodes.exec(controller, ["scontrol", "show", "node", "-o"], 15)
    except GpuyardError:
        return {}
    if code != 0:
        return {}
    found: dict[str, dict[str, str]] = {}
    for line in out.splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        if "NodeName" in fields:
            found[fields["NodeName"]] = fields
    return found


def slurmd_started(nodes: NodeRuntime, controller: str) -> dict[str, str]:
    """Each node's ``SlurmdStartTime`` as the controller knows it."""
    return {
        name: fields["SlurmdStartTime"]
        for name, fields in slurm_nodes(nodes, controller).items()
        if "SlurmdStartTime" in fields
    }


def resume_our_drains(nodes: NodeRuntime, controller: str) -> None:
    """Resume workers still drained by an update_image that did not finish (a
    restart is how a cluster in ``error`` is recovered, a start how a stopped one
    comes back); drains a user made with their own reason stay."""
    for name, fields in slurm_nodes(nodes, controller).items():
        if "DRAIN" in fields.get("State", "") and fields.get("Reason") == DRAIN_REASON:
            # Best effort: the cluster runs either way, and a user can resume it.
            try:
                code, out = scontrol(
                    nodes, controller, "update", f"nodename={name}", "state=resume"
                )
            except GpuyardError as exc:
                code, out = -1, exc.message
            if code != 0:
                log.warning("could not resume drained worker %s: %s", name, out[-300:])


def wait_reregistered(
    nodes: NodeRuntime,
    controller: str,
    workers: list[str],
    before: dict[str, str],
    timeout_s: float,
) -> None:
    """Until every restarted worker's slurmd has registered anew: right after a
    container restart Slurm still shows the old slurmd's state as idle."""
    deadline = time.monotonic() + timeout_s
    pending = [w for w in workers if w in before]
    while pending and time.monotonic() < deadline:
        now = slurmd_started(nodes, controller)
        pending = [w for w in pending if now.get(w, before[w]) == before[w]]
        if pending:
            time.sleep(0.5)


def scontrol(nodes: NodeRuntime, controller: str, *args: str) -> tuple[int, str]:
    return nodes.exec(controller, ["scontrol", *args], 30)


def drain(nodes: NodeRuntime, controller: str, node: str, timeout_s: float) -> None:
    """Drain ``node`` and wait (bounded) until its jobs are done."""
    scontrol(
        nodes, controller, "update", f"nodename={node}", "state=drain", f"reason={DRAIN_REASON}"
    )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        states = dict(nodes.sinfo(controller))
        state = states.get(node, "")
        if not state or state.startswith("drained") or "down" in state:
            return
        time.sleep(1.0)


def resume(nodes: NodeRuntime, controller: str, node: str, timeout_s: float) -> None:
    """Return a replaced worker to service: once its new slurmd has registered
    (it is still marked drained), resume it. Bounded by the ready timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        state = dict(nodes.sinfo(controller)).get(node, "")
        if state and not state.endswith("*") and "drain" not in state and "down" not in state:
            return
        if state and not state.endswith("*"):
            scontrol(nodes, controller, "update", f"nodename={node}", "state=resume")
        if time.monotonic() > deadline:
            return  # wait_slurm_ready reports what Slurm shows
        time.sleep(0.5)
