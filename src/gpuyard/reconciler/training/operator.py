"""The training operator: carries out training-cluster operations on real nodes.

An operation (``training_clusters.operation``) is recorded by the service in the same
transaction that validated it; the operator runs it as a job on the shared work queue
(reconciler/workqueue.py, key ``("training", cluster_id)``, the ``slow`` lane of the
engine of the cluster's host), so at most one job runs per cluster at a time, and
clears it when done. Every step is
idempotent, so an operation cut short by a crash is simply run again at the next start
(a periodic scan resumes any operation not in flight). A newer operation (e.g. a delete
during a create) supersedes the running one between steps.

Between operations the scan observes each running cluster's nodes: a controller or
worker whose container died is recreated and rejoins Slurm, as a job of the same key
(reconciler/training/recovery.py).

All of a cluster's nodes run on the engine of the host it was placed on (the host
whose capacity they claimed), through that host's runtime (runtimes/slurm/host_nodes.py);
the node image is copied to a host that lacks it before its nodes are created.

The operator also keeps each cluster's network edge in line with the store
(reconciler/training/edge.py).
"""

from __future__ import annotations

import base64
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sqlalchemy import distinct, func, select

from gpuyard.core.errors import GpuyardError
from gpuyard.core.states import ClusterStatus
from gpuyard.core.training.clusters import (
    LIFECYCLE_LOG,
    LifecycleStatus,
    NodeName,
    NodeRole,
    NodeStatus,
    TrainingStatus,
)
from gpuyard.observability.crash_points import crash_point
from gpuyard.reconciler.training import slurm_control
from gpuyard.reconciler.training.cluster_nodes import ClusterNodes
from gpuyard.reconciler.training.edge import ClusterEdges, EdgeOnHost, controller_host
from gpuyard.reconciler.training.keys import NodeKeys, node_keys_text
from gpuyard.reconciler.training.moves import move_nodes
from gpuyard.reconciler.training.networks import ClusterNetworks, hosts_file
from gpuyard.reconciler.training.nodes import (
    LANE,
    HostNodeRuntimes,
    NodeRuntime,
    Snapshot,
    Superseded,
)
from gpuyard.reconciler.training.recovery import NodeRecovery
from gpuyard.reconciler.workqueue import WorkQueue
from gpuyard.runtimes.slurm import config as slurm_config
from gpuyard.runtimes.slurm.nodes import NodeSpec
from gpuyard.services.context import Context
from gpuyard.services.tenancy.secrets import secret_box
from gpuyard.services.training.drain import MOVE_NODES
from gpuyard.services.training.nodes import nodes_of, transition_training
from gpuyard.services.training.stops import START, STOP, finish_stop
from gpuyard.services.training.use_cases import finish_delete
from gpuyard.store.schema import (
    Cluster,
    Host,
    ImageVersion,
    TrainingCluster,
    TrainingNode,
)

log = logging.getLogger(__name__)

LABEL_TRAINING = "gpuyard.training_cluster_id"
LABEL_ROLE = "gpuyard.role"
LABEL_NODE = "gpuyard.node"


class TrainingOperator:
    def __init__(
        self,
        ctx: Context,
        nodes: NodeRuntime,
        edge: EdgeOnHost | None,
        *,
        ready_timeout_s: float = 180.0,
        drain_timeout_s: float = 300.0,
        lifecycle_timeout_s: float = 1800.0,
        scan_interval_s: float = 5.0,
        bind_address: str = "0.0.0.0",
        workers: int = 8,
        queue: WorkQueue | None = None,
        hosts: HostNodeRuntimes | None = None,
        lane_of: Callable[[int | None], str] | None = None,
        owns: Callable[[], bool] | None = None,
    ) -> None:
        """``queue``: the work queue to run jobs on (the server passes the reconciler's,
        which has a ``slow`` lane); None: a private one with ``workers`` threads,
        closed by :meth:`stop`.

        ``nodes`` drives the nodes of clusters on this machine's engine; ``hosts``
        gives the node runtime of every host of a fleet, so each cluster's nodes run
        on the engine of the host whose capacity they claimed (None: every cluster's
        nodes run on ``nodes``, the single-engine mode). ``lane_of``: the queue lane of
        a host's jobs (the reconciler's lanes per engine, so a slow or dead host
        holds up only its own clusters); None: :data:`LANE`. ``owns``: whether this
        replica holds the ``training`` lease now (services/installation/leases.py; only its holder
        runs operations); None: this process owns them."""
        self.ctx = ctx
        self.nodes = nodes
        nodes.bind(ctx.ownership)
        self.hosts = hosts
        if hosts is not None:
            hosts.bind(ctx.ownership)
        self.lane_of = lane_of
        self.edges = ClusterEdges(ctx, edge, self.on_host, bind_address)
        self.ready_timeout_s = ready_timeout_s
        self.drain_timeout_s = drain_timeout_s
        self.lifecycle_timeout_s = lifecycle_timeout_s
        self.scan_interval_s = scan_interval_s
        # How often a scan also sweeps stale edge rules off the hosts (the first does).
        self.sweep_interval_s = 30.0
        self._next_sweep = 0.0
        self.bind_address = bind_address
        self._own_queue = queue is None
        self.queue = queue if queue is not None else WorkQueue({LANE: workers})
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._sinfo_cache: dict[int, tuple[float, list[tuple[str, str]]]] = {}
        self.networks = ClusterNetworks(self)
        self.recovery = NodeRecovery(self)
        self.node_keys = NodeKeys(self)
        self.owns: Callable[[], bool] = owns or (lambda: True)

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        self._thread = threading.Thread(target=self._scan_loop, name="training-scan", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        # A running job ends at its next step (_check); a shared queue is its owner's.
        if self._own_queue:
            self.queue.close(wait=False)
        self.edges.close()

    def on_host(self, host_id: int | None) -> NodeRuntime:
        """The node runtime of the engine of ``host_id`` (see ``hosts``). Raises
        RuntimeFailure for a host the fleet does not know."""
        if self.hosts is None:
            return self.nodes
        return self.hosts.on_host(host_id)

    def nodes_of(self, snap: Snapshot) -> ClusterNodes:
        """The cluster's nodes over every host they run on: each node on the engine of
        the host whose capacity it claimed (reconciler/training/cluster_nodes.py)."""
        return self.cluster_nodes(snap.cluster, snap.nodes, snap.addresses)

    def cluster_nodes(
        self,
        cluster: TrainingCluster,
        nodes: Sequence[TrainingNode],
        addresses: Mapping[int, str] | None = None,
    ) -> ClusterNodes:
        names = NodeName(cluster.id, cluster.name_prefix)
        placement = {n.name: n.host_id for n in nodes}
        placement.setdefault(names.controller, cluster.host_id)
        return ClusterNodes(self.on_host, placement, names.controller, cluster.subnet, addresses)

    def _scan_loop(self) -> None:
        while not self._stop.is_set():
            try:
                if self.owns():
                    self.scan()
            except Exception:
                log.exception("training scan failed")
            self._stop.wait(self.scan_interval_s)

    def scan(self) -> None:
        """Resume every recorded operation not in flight; bring every other live
        cluster's edge in line with the store (after a start: rebuild it; after a sync
        that failed, e.g. the engine did not answer: heal it; remove rules nothing
        should have any more); and hand each running
        cluster with a dead node, or whose nodes' SSH keys are no longer the ones
        that open it (reconciler/training/keys.py), to the queue, where it is brought back in
        line."""
        with self.ctx.read() as session:
            rows = session.execute(
                select(
                    TrainingCluster.id,
                    TrainingCluster.operation,
                    TrainingCluster.status,
                    TrainingCluster.host_id,
                ).where(TrainingCluster.deleted_at.is_(None))
            ).all()
            keys_stale = set(self.node_keys.scan(session))
            spanning = set(
                session.scalars(
                    select(TrainingNode.cluster_id)
                    .group_by(TrainingNode.cluster_id)
                    .having(func.count(distinct(TrainingNode.host_id)) > 1)
                )
            )
        for cluster_id, operation, status, host_id in rows:
            if operation is not None:
                self._submit(cluster_id, host_id)
                continue
            self.sync_edge(cluster_id)
            if status == TrainingStatus.RUNNING and cluster_id in spanning:
                self.networks.heal_soon(cluster_id, host_id)
            if status == TrainingStatus.RUNNING and (
                cluster_id in keys_stale or self.recovery.wanted(cluster_id)
            ):
                self._submit(cluster_id, host_id)
        # Rules no live cluster should have where they are (after a restart: a
        # controller that moved, a teardown another process finished). One read per
        # host, so not at every scan.
        now = time.monotonic()
        if now >= self._next_sweep:
            self._next_sweep = now + self.sweep_interval_s
            self.edges.sweep()

    def wake(self, cluster_id: int) -> None:
        """Queue the cluster's job: its recorded operation, or (with none) bringing back
        its dead nodes. If its job is running, it runs once more afterwards (the
        newest operation then supersedes), never twice at once."""
        if self._stop.is_set() or not self.owns():
            return  # another replica's scan picks it up
        host_id = None
        if self.lane_of is not None:
            with self.ctx.read() as session:
                host_id = session.scalar(
                    select(TrainingCluster.host_id).where(TrainingCluster.id == cluster_id)
                )
        self._submit(cluster_id, host_id)

    def _submit(self, cluster_id: int, host_id: int | None) -> None:
        """Queue the cluster's job on the lane of its host's engine."""
        if self._stop.is_set() or not self.owns():
            return
        lane = self.lane_of(host_id) if self.lane_of is not None else LANE
        self.queue.submit(("training", cluster_id), lane, lambda: self._drive(cluster_id))

    def _drive(self, cluster_id: int) -> None:
        if self._stop.is_set():
            return
        try:
            if not self._run_once(cluster_id):
                self.recover(cluster_id)
                self.node_keys.refresh(cluster_id)
        except Exception:
            log.exception("training cluster %s: operation failed", cluster_id)

    # ------------------------------------------------------------ reading

    def snapshot(self, cluster_id: int) -> Snapshot | None:
        with self.ctx.read() as session:
            cluster = session.get(TrainingCluster, cluster_id)
            if cluster is None or cluster.deleted_at is not None:
                return None
            nodes = nodes_of(session, cluster_id)
            image_ids = {cluster.image_version_id, *(n.image_version_id for n in nodes)}
            images = {
                i.id: i.image
                for i in session.scalars(select(ImageVersion).where(ImageVersion.id.in_(image_ids)))
            }
            # Only the keys that open the cluster now (reconciler/training/keys.py).
            keys_text = node_keys_text(session, [cluster])[cluster.id]
            host_ids = {n.host_id for n in nodes if n.host_id is not None}
            addresses = dict(
                session.execute(select(Host.id, Host.address).where(Host.id.in_(host_ids))).all()
            )
            session.expunge_all()
        return Snapshot(cluster, nodes, images, keys_text, cluster.operation, addresses)

    def check(self, cluster_id: int, token: str | None) -> None:
        """Raise Superseded unless operation ``token`` is still the recorded one
        (``None``: unless no operation is recorded, for a recovery), or when stopping."""
        if self._stop.is_set():
            raise Superseded()
        with self.ctx.read() as session:
            op = session.scalar(
                select(TrainingCluster.operation).where(TrainingCluster.id == cluster_id)
            )
        current = op.get("token") if op else None
        if (token is None and op) or (token is not None and current != token):
            raise Superseded()

    # ------------------------------------------------------------ running

    def run(self, cluster_id: int) -> None:
        """Carry out the cluster's recorded operation now, in this thread (the queue's
        jobs call this; so can tests and tools)."""
        self._run_once(cluster_id)

    def recover(self, cluster_id: int) -> None:
        """Bring back the nodes of a running cluster with no operation whose containers
        died, now, in this thread (see NodeRecovery.run). A no-op while an operation
        is recorded; one requested meanwhile supersedes it and is queued."""
        try:
            self.recovery.run(cluster_id)
        except Superseded:
            self.wake(cluster_id)

    def _run_once(self, cluster_id: int) -> bool:
        """Run the recorded operation; False when there is none (or no cluster)."""
        snap = self.snapshot(cluster_id)
        if snap is None or snap.operation is None:
            return False
        action = snap.operation.get("action")
        token = str(snap.operation.get("token"))
        # Nodes are made or restarted from this snapshot: the next key pass checks
        # them all again.
        self.node_keys.forget(cluster_id)
        try:
            if action == "delete":
                try:
                    self._teardown(snap)
                except Exception:
                    # Stays `deleting`; the periodic scan tries again.
                    log.exception("training cluster %s: teardown failed", cluster_id)
                    return True
                crash_point("training.teardown.after_nodes_removed")
                finish_delete(self.ctx, cluster_id)
                self._sinfo_cache.pop(cluster_id, None)
                self.recovery.forget(cluster_id)
                return True
            if action == STOP:
                try:
                    self._halt(snap, token)
                except Superseded:
                    raise
                except Exception as exc:
                    # Stays `stopping` (billing ended at the stop; the GPUs stay held
                    # until the nodes are gone); the scan tries again.
                    log.warning("training cluster %s: stop not done yet: %s", cluster_id, exc)
                    return True
                finish_stop(self.ctx, cluster_id, token)
                self._sinfo_cache.pop(cluster_id, None)
                self.recovery.forget(cluster_id)
                self.sync_edge(cluster_id)
                return True
            if action in ("create", "scale_cluster", START):
                self._build(snap, token)
            elif action == MOVE_NODES:
                if not move_nodes(self, self.networks, snap, token):
                    return True  # a host the nodes left does not answer: the scan retries
            elif action == "restart_workers":
                self._restart(snap, token, controller=False)
            elif action == "restart_cluster":
                self._restart(snap, token, controller=True)
            elif action == "update_ssh_keys":
                nodes = self.nodes_of(snap)
                for node in snap.nodes:
                    self.check(cluster_id, token)
                    nodes.install_authorized_keys(node.name, snap.keys_text)
            elif action == "update_image":
                self._roll_image(snap, token)
            else:
                raise GpuyardError(f"unknown operation {action!r}")
            # Nodes whose container is new run the lifecycle script once: the
            # operation is done when it has finished on each of them.
            failed = self.await_lifecycle(self.nodes_of(snap), cluster_id, token)
            self._finish(cluster_id, token, None, failed)
        except Superseded:
            self.wake(cluster_id)
        except GpuyardError as exc:
            self._finish(cluster_id, token, exc.message)
        except Exception as exc:  # a bug or an engine surprise: the cluster shows it
            log.exception("training cluster %s: %s failed", cluster_id, action)
            self._finish(cluster_id, token, f"{type(exc).__name__}: {exc}")
        self.sync_edge(cluster_id)
        return True

    def _finish(
        self, cluster_id: int, token: str, error: str | None, failed: Sequence[str] = ()
    ) -> None:
        """End the operation ``token``: back to ``running`` (its status reason naming
        the nodes whose lifecycle script failed, if any) or to ``error``."""
        with self.ctx.transaction() as session:
            cluster = session.get(TrainingCluster, cluster_id, with_for_update=True)
            if cluster is None or not cluster.operation:
                return
            if cluster.operation.get("token") != token:
                return
            action = cluster.operation.get("action")
            now = self.ctx.clock.now()
            if error is not None:
                transition_training(
                    session,
                    cluster,
                    TrainingStatus.ERROR,
                    f"{action} failed",
                    now,
                    error_message=error,
                )
                return
            reason = f"{action} done"
            if failed:
                reason += (
                    f"; the lifecycle script failed on {', '.join(failed)} "
                    f"(its output is in {LIFECYCLE_LOG} on the node)"
                )
            transition_training(session, cluster, TrainingStatus.RUNNING, reason, now)

    def set_nodes(self, ids: Sequence[int], status: NodeStatus, **values: Any) -> None:
        with self.ctx.transaction() as session:
            for node_id in ids:
                node = session.get(TrainingNode, node_id)
                if node is not None:
                    node.status = status.value
                    for k, v in values.items():
                        setattr(node, k, v)

    # ------------------------------------------------------------ node files

    def _files(self, snap: Snapshot, node: TrainingNode) -> dict[str, tuple[bytes, int]]:
        c = snap.cluster
        names = NodeName(c.id, c.name_prefix)
        files: dict[str, tuple[bytes, int]] = {
            "munge.key": (base64.b64decode(secret_box(self.ctx.settings).open(c.munge_key)), 0o400),
            "slurm.conf": (
                slurm_config.slurm_conf(names.prefix, names.controller, 64).encode(),
                0o644,
            ),
            "authorized_keys": (snap.keys_text.encode(), 0o600),
        }
        if node.role == NodeRole.WORKER:
            files["gres.conf"] = (slurm_config.gres_conf(c.gpus_per_node).encode(), 0o644)
        if c.lifecycle_script:
            files["lifecycle.sh"] = (c.lifecycle_script.encode(), 0o755)
        return files

    def _spec(self, snap: Snapshot, node: TrainingNode, image_version_id: int) -> NodeSpec:
        c = snap.cluster
        names = NodeName(c.id, c.name_prefix)
        controller = node.role == NodeRole.CONTROLLER
        return NodeSpec(
            name=node.name,
            role="controller" if controller else "worker",
            image=snap.images[image_version_id],
            network=names.network,
            cpus=2 if controller else c.cpus_per_node,
            memory_gb=4 if controller else c.memory_gb_per_node,
            gpu_count=0 if controller else c.gpus_per_node,
            gpu_indices=tuple(node.gpu_indices),
            labels={
                LABEL_TRAINING: str(c.id),
                LABEL_ROLE: node.role,
                LABEL_NODE: node.name,
            },
            state_volume=names.state_volume if controller else None,
            address=node.address,
            hosts=hosts_file(snap),
        )

    def create(self, snap: Snapshot, node: TrainingNode, image_version_id: int) -> str:
        """Create the node's container; a new container runs the cluster's lifecycle
        script once, so the store marks it running (awaited by _await_lifecycle)."""
        container = self.nodes_of(snap).create_node(
            self._spec(snap, node, image_version_id), self._files(snap, node)
        )
        crash_point("training.build.after_node_create")
        script = bool(snap.cluster.lifecycle_script)
        with self.ctx.transaction() as session:
            row = session.get(TrainingNode, node.id)
            if row is not None:
                row.lifecycle_status = LifecycleStatus.RUNNING.value if script else None
                row.lifecycle_exit_code = None
        return container

    def await_lifecycle(self, nodes: NodeRuntime, cluster_id: int, token: str | None) -> list[str]:
        """Wait until the lifecycle script has finished on every node the store shows
        it running on (bounded by ``lifecycle_timeout_s`` from now) and record each
        result. Returns the nodes where it failed or timed out, one phrase each.
        ``token``: the operation waiting (None: a recovery, which says nothing in the
        cluster's status reason)."""
        with self.ctx.read() as session:
            pending = dict(
                session.execute(
                    select(TrainingNode.id, TrainingNode.name).where(
                        TrainingNode.cluster_id == cluster_id,
                        TrainingNode.lifecycle_status == LifecycleStatus.RUNNING.value,
                    )
                ).all()
            )
        if not pending:
            return []
        if token is not None:
            self._set_reason(
                cluster_id, token, f"running the lifecycle script on {len(pending)} node(s)"
            )
        failed: list[str] = []
        deadline = time.monotonic() + self.lifecycle_timeout_s
        while pending:
            self.check(cluster_id, token)
            for node_id, name in list(pending.items()):
                code = nodes.lifecycle_result(name)
                if code is None:
                    continue
                del pending[node_id]
                ok = code == 0
                status = LifecycleStatus.SUCCEEDED if ok else LifecycleStatus.FAILED
                self._set_lifecycle(node_id, status, code)
                if not ok:
                    failed.append(f"{name} (exit {code})")
            if pending and time.monotonic() >= deadline:
                for node_id, name in pending.items():
                    self._set_lifecycle(node_id, LifecycleStatus.TIMED_OUT, None)
                    failed.append(f"{name} (still running after {self.lifecycle_timeout_s:g} s)")
                break
            if pending:
                self._stop.wait(1.0)
        return sorted(failed)

    def _set_lifecycle(self, node_id: int, status: LifecycleStatus, code: int | None) -> None:
        with self.ctx.transaction() as session:
            row = session.get(TrainingNode, node_id)
            if row is not None:
                row.lifecycle_status = status.value
                row.lifecycle_exit_code = code

    def _set_reason(self, cluster_id: int, token: str, reason: str) -> None:
        """Say what the running operation is doing (only while ``token`` is current)."""
        with self.ctx.transaction() as session:
            cluster = session.get(TrainingCluster, cluster_id, with_for_update=True)
            if cluster is not None and (cluster.operation or {}).get("token") == token:
                cluster.status_reason = reason
                cluster.updated_at = self.ctx.clock.now()

    # ------------------------------------------------------------ operations

    def _build(self, snap: Snapshot, token: str) -> None:
        """Create every node not yet running (controller first), then wait until Slurm
        lists every worker as usable. Running nodes are left alone, so a scale never
        disturbs running jobs."""
        nodes = self.nodes_of(snap)
        c = snap.cluster
        names = NodeName(c.id, c.name_prefix)
        self.ship_images(nodes, snap, token, {n.image_version_id for n in snap.nodes})
        nodes.ensure_network(names.network)
        ordered = sorted(snap.nodes, key=lambda n: n.role != NodeRole.CONTROLLER)
        for node in ordered:
            self.check(c.id, token)
            state = nodes.node_state(node.name)
            if node.status == NodeStatus.RUNNING and state == "running":
                continue
            creating = bool(snap.operation and snap.operation.get("action") == "create")
            if node.role == NodeRole.CONTROLLER and state == "missing" and creating:
                # A new cluster starts with an empty Slurm state, whatever an earlier
                # install with the same ids left behind.
                nodes.remove_volume(names.state_volume)
            self.wait_gpus_free(node, c.id, token)
            container = self.create(snap, node, node.image_version_id)
            self.set_nodes([node.id], NodeStatus.CREATING, container_id=container)
        self.networks.publish_hosts(nodes, snap)
        workers = [n.name for n in snap.nodes if n.role == NodeRole.WORKER]
        nodes.wait_slurm_ready(names.controller, workers, self.ready_timeout_s)
        # An update_image that a stop cut short may have left workers drained in the
        # kept Slurm state: a build ends with none of ours.
        slurm_control.resume_our_drains(nodes, names.controller)
        self.set_nodes([n.id for n in snap.nodes], NodeStatus.RUNNING)

    def ship_images(
        self, nodes: NodeRuntime, snap: Snapshot, token: str, image_version_ids: set[int]
    ) -> None:
        """Copy the node images the cluster's host lacks (once per host and image
        version, runtimes/slurm/node_image_copy.py), saying how far each copy is in the
        cluster's status reason, which is given back afterwards."""
        c = snap.cluster
        copied = False
        for image in sorted({snap.images[i] for i in image_version_ids}):
            self.check(c.id, token)
            copied |= nodes.ensure_image(image, lambda text: self._set_reason(c.id, token, text))
        if copied:
            self._set_reason(c.id, token, c.status_reason)

    def wait_gpus_free(self, node: TrainingNode, cluster_id: int, token: str) -> None:
        """A spot cluster preempted for this node may still be stopping on its GPUs:
        wait until it has stopped, so no GPU is ever shared."""
        if not node.gpu_indices or node.host_id is None:
            return
        mine = set(node.gpu_indices)
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            with self.ctx.read() as session:
                leaving = session.scalars(
                    select(Cluster.gpu_indices).where(
                        Cluster.host_id == node.host_id,
                        Cluster.status == ClusterStatus.STOPPING.value,
                    )
                )
                if not any(mine & set(indices) for indices in leaving):
                    return
            self.check(cluster_id, token)
            time.sleep(0.5)
        raise GpuyardError(f"GPUs {sorted(mine)} are still held by a stopping cluster")

    def _restart(self, snap: Snapshot, token: str, *, controller: bool) -> None:
        nodes = self.nodes_of(snap)
        names = NodeName(snap.cluster.id, snap.cluster.name_prefix)
        workers = [n for n in snap.nodes if n.role == NodeRole.WORKER]
        chosen = [n for n in snap.nodes if controller or n.role == NodeRole.WORKER]
        self.set_nodes([n.id for n in chosen], NodeStatus.RESTARTING)
        # Also for workers only: one moved to another host (a drain) needs the network there.
        nodes.ensure_network(names.network)
        before = slurm_control.slurmd_started(nodes, names.controller)
        for node in sorted(chosen, key=lambda n: n.role != NodeRole.CONTROLLER):
            self.check(snap.cluster.id, token)
            if nodes.node_state(node.name) == "missing":
                self.create(snap, node, node.image_version_id)
            else:
                nodes.restart_node(node.name)
                # A node an interrupted update_ssh_keys missed gets the keys now.
                nodes.install_authorized_keys(node.name, snap.keys_text)
        self.networks.publish_hosts(nodes, snap)
        slurm_control.wait_reregistered(
            nodes, names.controller, [n.name for n in workers], before, self.ready_timeout_s
        )
        slurm_control.resume_our_drains(nodes, names.controller)
        nodes.wait_slurm_ready(names.controller, [n.name for n in workers], self.ready_timeout_s)
        self.set_nodes([n.id for n in chosen], NodeStatus.RUNNING)

    def readdress(self, nodes: NodeRuntime, snap: Snapshot) -> None:
        """Tell a replaced controller where each worker is now. Slurm keeps a dynamic
        node's address from the state file, which may predate the worker's own
        re-registration (workers were replaced before the controller)."""
        names = NodeName(snap.cluster.id, snap.cluster.name_prefix)
        for node in snap.nodes:
            if node.role != NodeRole.WORKER:
                continue
            address = nodes.node_address(node.name, names.network)
            if address:
                slurm_control.scontrol(
                    nodes,
                    names.controller,
                    "update",
                    f"NodeName={node.name}",
                    f"NodeAddr={address}",
                    f"NodeHostname={node.name}",
                )

    def _roll_image(self, snap: Snapshot, token: str) -> None:
        """Replace each node whose image differs, one at a time: workers drained first
        and resumed after; the controller last (its state volume keeps the queue)."""
        nodes = self.nodes_of(snap)
        c = snap.cluster
        names = NodeName(c.id, c.name_prefix)
        workers = [n.name for n in snap.nodes if n.role == NodeRole.WORKER]
        ordered = sorted(snap.nodes, key=lambda n: n.role == NodeRole.CONTROLLER)
        if any(n.image_version_id != c.image_version_id for n in ordered):
            self.ship_images(nodes, snap, token, {c.image_version_id})
        for node in ordered:
            if node.image_version_id == c.image_version_id:
                continue
            self.check(c.id, token)
            self.set_nodes([node.id], NodeStatus.REPLACING)
            worker = node.role == NodeRole.WORKER
            if worker:
                slurm_control.drain(nodes, names.controller, node.name, self.drain_timeout_s)
            nodes.remove_node(node.name)
            container = self.create(snap, node, c.image_version_id)
            if worker:
                slurm_control.resume(nodes, names.controller, node.name, self.ready_timeout_s)
            nodes.wait_slurm_ready(names.controller, workers, self.ready_timeout_s)
            self.set_nodes(
                [node.id],
                NodeStatus.RUNNING,
                image_version_id=c.image_version_id,
                container_id=container,
            )
            if not worker:
                self.readdress(nodes, snap)
                self.sync_edge(c.id)  # the controller's address may have changed

    def _halt(self, snap: Snapshot, token: str) -> None:
        """Remove every node container of a stopping cluster (those the store lists and
        any other carrying its label). The Slurm state volume and the network stay for
        the start; a lifecycle script cut short is not awaited."""
        nodes = self.nodes_of(snap)
        for name in self._containers_of(nodes, snap):
            self.check(snap.cluster.id, token)
            nodes.remove_node(name)

    def _containers_of(self, nodes: NodeRuntime, snap: Snapshot) -> set[str]:
        """The cluster's node containers: those the store lists and any other the
        engine has with its label (one a crash left between create and record)."""
        return {
            *(n.name for n in snap.nodes),
            *nodes.list_nodes(LABEL_TRAINING, str(snap.cluster.id)),
        }

    def _teardown(self, snap: Snapshot) -> None:
        nodes = self.nodes_of(snap)
        c = snap.cluster
        names = NodeName(c.id, c.name_prefix)
        with self.ctx.read() as session:
            cluster = session.get(TrainingCluster, c.id)
            hosts = {c.host_id, controller_host(session, cluster) if cluster else None}
        self.edges.drop(c.id, hosts)
        for name in self._containers_of(nodes, snap):
            nodes.remove_node(name)
        nodes.remove_network(names.network)
        nodes.remove_volume(names.state_volume)

    def sync_edge(self, cluster_id: int) -> None:
        """Make the cluster's SSH rules and security groups match the store (see
        ClusterEdges.sync). Safe to call any time, from any thread."""
        self.edges.sync(cluster_id)

    # ------------------------------------------------------------ reads for views

    def partition_state(
        self, cluster_id: int, max_age_s: float = 2.0
    ) -> list[tuple[str, str]] | None:
        """Slurm's view of the nodes (``sinfo``), cached briefly; None when the
        controller does not answer."""
        hit = self._sinfo_cache.get(cluster_id)
        if hit is not None and time.monotonic() - hit[0] < max_age_s:
            return hit[1]
        with self.ctx.read() as session:
            row = session.execute(
                select(TrainingCluster.name_prefix, TrainingCluster.host_id).where(
                    TrainingCluster.id == cluster_id
                )
            ).first()
        if row is None:
            return None
        prefix, host_id = row
        try:
            nodes = self.on_host(host_id)
            states = nodes.sinfo(NodeName(cluster_id, prefix).controller)
        except Exception:
            return None
        self._sinfo_cache[cluster_id] = (time.monotonic(), states)
        return states
