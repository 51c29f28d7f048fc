"""Desired state wins for training clusters too (DESIGN.md rule 9, issue 10 item 5).

A running training cluster with no operation in progress should have every node up.
When a controller or worker container has died (exited, or gone), the operator brings
it back as a job of the cluster's own key on the work queue, so it never runs beside a
user's operation, and an operation requested meanwhile supersedes it between steps:

- the node is recreated with the same spec (name, image, GPUs, files); the controller
  keeps its state volume, so queued and pending jobs survive;
- a worker's new slurmd registers anew and the recovery waits until Slurm lists it as
  usable (as restart_workers does); after a new controller, until every worker is
  usable again and the controller knows their addresses;
- ``TrainingNode.restarts`` counts each recreation and the cluster's events say what
  died and what was done;
- attempts on one node are spaced by exponential back-off (the cluster restart
  settings: ``restart_backoff_initial_s`` doubling to ``restart_backoff_max_s``,
  counted within ``restart_window_s``). The cluster stays ``running`` throughout: its
  other nodes keep serving, and a node that cannot be recreated shows ``error`` and is
  tried again after its back-off.

An engine that does not answer is not a death: nothing is recreated until the engine
says a container is exited or missing. Clusters in ``error`` are left alone (their
failed containers keep their logs; restart_cluster is how a user brings them back).
The back-off history is kept in memory: after a server restart a dead node is tried
at once.
"""

from __future__ import annotations

import logging
import threading
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from gpuyard.core.errors import GpuyardError
from gpuyard.core.restarts import RestartPolicy
from gpuyard.core.training.clusters import (
    NodeName,
    NodeRole,
    NodeStatus,
    TrainingStatus,
    cluster_owner,
)
from gpuyard.reconciler.training import slurm_control
from gpuyard.services.clusters.lifecycle import record_event
from gpuyard.services.training.nodes import nodes_of
from gpuyard.store.schema import TrainingCluster, TrainingNode

if TYPE_CHECKING:
    from gpuyard.reconciler.training.nodes import NodeRuntime, Snapshot
    from gpuyard.reconciler.training.steps import OperatorSteps

log = logging.getLogger(__name__)

# Container states that mean the node is dead (``created``: being started, not dead).
DEAD = frozenset({"missing", "exited"})
# Node statuses a recovery leaves until the node is confirmed back in Slurm: a node
# showing one of these (with no operation) is looked at again.
UNCONFIRMED = frozenset({NodeStatus.RESTARTING.value, NodeStatus.ERROR.value})
EVENT_TYPE = "restart"


class NodeRecovery:
    """Brings back the dead nodes of one operator's running clusters. Thread-safe;
    :meth:`run` must only be called as the cluster's job (one at a time per cluster)."""

    def __init__(self, operator: OperatorSteps) -> None:
        self.op = operator
        s = operator.ctx.settings
        self.policy = RestartPolicy(
            initial_s=s.restart_backoff_initial_s,
            max_s=s.restart_backoff_max_s,
            window_s=s.restart_window_s,
        )
        self._lock = threading.Lock()
        # Node id -> when each recent attempt to recreate it was made.
        self._attempts: dict[int, list[datetime]] = {}

    # ------------------------------------------------------------ back-off

    def _recent(self, node_id: int, now: datetime) -> list[datetime]:
        window = timedelta(seconds=self.policy.window_s)
        with self._lock:
            kept = [t for t in self._attempts.get(node_id, []) if now - t < window]
            self._attempts[node_id] = kept
            return list(kept)

    def due_at(self, node_id: int, now: datetime) -> datetime:
        """When the next attempt on the node may be made: at once for the first in the
        window, then ``initial_s`` after the last attempt, doubling up to ``max_s``."""
        recent = self._recent(node_id, now)
        if not recent:
            return now
        return recent[-1] + timedelta(seconds=self.policy.delay(len(recent)))

    def _attempted(self, node_id: int, now: datetime) -> None:
        with self._lock:
            self._attempts.setdefault(node_id, []).append(now)

    def forget(self, cluster_id: int) -> None:
        """Drop the back-off history of a deleted cluster's nodes."""
        with self.op.ctx.read() as session:
            ids = {n.id for n in nodes_of(session, cluster_id)}
        with self._lock:
            for node_id in ids:
                self._attempts.pop(node_id, None)

    # ------------------------------------------------------------ observing

    def _observe(
        self, cluster: TrainingCluster, nodes: list[TrainingNode]
    ) -> dict[int, str] | None:
        """Each node's container state on the engine of its host; None when an engine
        does not answer (which says nothing about the nodes)."""
        try:
            runtime = self.op.cluster_nodes(cluster, nodes)
            return {n.id: runtime.node_state(n.name) for n in nodes}
        except Exception as exc:  # engine down, timing out, answering garbage
            log.info("training nodes not observed: %s", exc)
            return None

    def _suspects(
        self, cluster: TrainingCluster, nodes: list[TrainingNode]
    ) -> list[tuple[TrainingNode, str]] | None:
        """Nodes that may need bringing back, with their container state (None: an
        engine did not answer)."""
        states = self._observe(cluster, nodes)
        if states is None:
            return None
        return [(n, states[n.id]) for n in nodes if states[n.id] in DEAD or n.status in UNCONFIRMED]

    def wanted(self, cluster_id: int) -> bool:
        """Whether the cluster has a node to bring back whose back-off has ended. Cheap
        (one read, one inspect per node); the job decides again before acting."""
        with self.op.ctx.read() as session:
            cluster = session.get(TrainingCluster, cluster_id)
            if cluster is None:
                return False
            nodes = nodes_of(session, cluster_id)
            session.expunge_all()
        suspects = self._suspects(cluster, nodes)
        if not suspects:
            return False
        now = self.op.ctx.clock.now()
        return any(self.due_at(n.id, now) <= now for n, _ in suspects)

    # ------------------------------------------------------------ recovering

    def run(self, cluster_id: int) -> None:
        """Bring back the cluster's dead nodes whose back-off has ended (controller
        first), and wait until they serve in Slurm again. A no-op unless the cluster
        is running with no operation recorded. Raises Superseded (from the operator's
        step check) when an operation was requested meanwhile; other failures are
        recorded on the nodes and events and retried after their back-off."""
        snap = self.op.snapshot(cluster_id)
        if snap is None or snap.operation is not None:
            return
        if snap.cluster.status != TrainingStatus.RUNNING:
            return
        runtime = self.op.nodes_of(snap)
        suspects = self._suspects(snap.cluster, snap.nodes)
        if not suspects:
            return
        names = NodeName(snap.cluster.id, snap.cluster.name_prefix)
        confirmed = self._still_serving(runtime, names.controller, suspects)
        if confirmed:
            self.op.set_nodes([n.id for n in confirmed], NodeStatus.RUNNING)
        now = self.op.ctx.clock.now()
        due = [
            (n, state)
            for n, state in suspects
            if n not in confirmed and self.due_at(n.id, now) <= now
        ]
        if not due:
            return
        due.sort(key=lambda pair: pair[0].role != NodeRole.CONTROLLER)
        self.op.check(cluster_id, None)
        controller_due = any(n.role == NodeRole.CONTROLLER for n, _ in due)
        before = {} if controller_due else slurm_control.slurmd_started(runtime, names.controller)
        runtime.ensure_network(names.network)
        revived: list[TrainingNode] = []
        failed: list[str] = []
        for node, state in due:
            self.op.check(cluster_id, None)
            if self._recreate(snap, node, state, now):
                revived.append(node)
            else:
                failed.append(node.name)
        if revived:
            self._rejoin(runtime, snap, revived, failed, before)

    def _still_serving(
        self, runtime: NodeRuntime, controller: str, suspects: list[tuple[TrainingNode, str]]
    ) -> list[TrainingNode]:
        """Nodes marked unconfirmed whose container runs and that Slurm lists as up (a
        recovery cut short after the node had rejoined): nothing to recreate."""
        running = [n for n, state in suspects if state == "running"]
        if not running:
            return []
        try:
            listed = dict(runtime.sinfo(controller))
        except Exception:
            return []
        up: list[TrainingNode] = []
        for node in running:
            if node.role == NodeRole.CONTROLLER:
                up.append(node)  # it answered sinfo
                continue
            state = listed.get(node.name, "")
            if state and not state.endswith("*") and "down" not in state:
                up.append(node)
        return up

    def _recreate(self, snap: Snapshot, node: TrainingNode, state: str, now: datetime) -> bool:
        """One attempt at recreating ``node`` (counted for its back-off). True when its
        container was created; a failure is recorded on the node and in the events."""
        cluster_id = snap.cluster.id
        number = node.restarts + 1
        self._attempted(node.id, now)
        if state == "missing":
            what = "its container is gone"
        elif state in DEAD:
            what = f"its container {state}"
        else:
            what = "it did not rejoin Slurm after it was recreated"
        message = f"{node.role} {node.name}: {what}; recreating it (restart {number})"
        self._event(cluster_id, message)
        self.op.set_nodes([node.id], NodeStatus.RESTARTING)
        try:
            container = self.op.create(snap, node, node.image_version_id)
        except GpuyardError as exc:
            self._failed(cluster_id, [node], f"recreating it failed: {exc.message}")
            return False
        self.op.set_nodes([node.id], NodeStatus.RESTARTING, container_id=container, restarts=number)
        log.info("training cluster %s: recreated %s (restart %d)", cluster_id, node.name, number)
        return True

    def _rejoin(
        self,
        runtime: NodeRuntime,
        snap: Snapshot,
        revived: list[TrainingNode],
        failed: list[str],
        before: dict[str, str],
    ) -> None:
        """Wait until the recreated nodes serve in Slurm again, then mark them running
        and wait for the lifecycle script their new containers run."""
        c = snap.cluster
        names = NodeName(c.id, c.name_prefix)
        workers = [n.name for n in snap.nodes if n.role == NodeRole.WORKER]
        new_workers = [n.name for n in revived if n.role == NodeRole.WORKER]
        controller_new = any(n.role == NodeRole.CONTROLLER for n in revived)
        try:
            if controller_new:
                # The new slurmctld restores its state from the volume; every worker
                # that is up must be usable again, at its current address.
                expected = [w for w in workers if w not in failed]
                runtime.wait_slurm_ready(names.controller, expected, self.op.ready_timeout_s)
                self.op.readdress(runtime, snap)
                self.op.sync_edge(c.id)
            else:
                # Right after the container is replaced Slurm may still show the old
                # slurmd's state: wait for the new one's registration first.
                slurm_control.wait_reregistered(
                    runtime, names.controller, new_workers, before, self.op.ready_timeout_s
                )
                runtime.wait_slurm_ready(names.controller, new_workers, self.op.ready_timeout_s)
        except GpuyardError as exc:
            self._failed(c.id, revived, f"did not rejoin Slurm: {exc.message}")
            return
        self.op.set_nodes([n.id for n in revived], NodeStatus.RUNNING)
        self._event(
            c.id,
            "back in Slurm: " + ", ".join(f"{n.name} (restart {n.restarts + 1})" for n in revived),
        )
        lifecycle = self.op.await_lifecycle(runtime, c.id, None)
        if lifecycle:
            self._event(c.id, f"the lifecycle script failed on {', '.join(lifecycle)}")

    def _failed(self, cluster_id: int, nodes: list[TrainingNode], why: str) -> None:
        now = self.op.ctx.clock.now()
        self.op.set_nodes([n.id for n in nodes], NodeStatus.ERROR)
        for node in nodes:
            wait = (self.due_at(node.id, now) - now).total_seconds()
            self._event(cluster_id, f"{node.name}: {why}; next attempt in {wait:g} s")
            log.warning("training cluster %s: %s: %s", cluster_id, node.name, why)

    def _event(self, cluster_id: int, message: str) -> None:
        with self.op.ctx.transaction() as session:
            record_event(
                session, cluster_owner(cluster_id), self.op.ctx.clock.now(), EVENT_TYPE, message
            )
