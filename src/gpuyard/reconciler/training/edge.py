"""A training cluster's network edge: its SSH port and reserved IPs reach the
controller's sshd, filtered by the cluster's security groups, by rules in the kernel of
the host the controller runs on (runtimes/hosts/edge.py). No user traffic passes through
this process: a session outlives the API process, even a ``kill -9``.

The store says what the edge should be; :meth:`ClusterEdges.sync` makes the host's
rules match it and is safe to call at any time (the training operator calls it after
every operation and on every scan, so a sync that failed, or a host firewall that was
reloaded, heals within the scan interval). When the engine does not answer where the
controller is, the last address known is used, so a detached IP or a new security group
still takes effect at once.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Protocol

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpuyard.core.network import secgroups
from gpuyard.core.training.clusters import NodeName, NodeRole, TrainingStatus
from gpuyard.runtimes.hosts.edge import ClusterEdge
from gpuyard.runtimes.hosts.firewall import bridge_name
from gpuyard.services.context import Context
from gpuyard.services.training.use_cases import SSH_PORT
from gpuyard.store.schema import (
    Host,
    ReservedIp,
    SecurityGroup,
    TrainingCluster,
    TrainingNode,
)

log = logging.getLogger(__name__)

Listener = tuple[str, int]


class HostEdge(Protocol):
    """What the edge needs of runtimes/host_edge.IptablesEdge: one host's rules."""

    def apply(self, edge: ClusterEdge) -> None: ...
    def remove(self, cluster_id: int) -> None: ...
    def clusters(self) -> set[int]: ...


# The edge of a host (None: a cluster with no host recorded, which runs here). Returns
# None for a host whose firewall cannot be managed from here (a tcp:// engine).
EdgeOnHost = Callable[[int | None], HostEdge | None]


class ControllerAddresses(Protocol):
    """What the edge needs of the node runtime: where a controller is reached."""

    def node_address(self, name: str, network: str) -> str | None: ...


# The node runtime of a host's engine (None: a cluster with no host recorded).
NodesOnHost = Callable[[int | None], ControllerAddresses]


class ClusterEdges:
    """Every training cluster's rules, on its controller's host. With no ``edges``
    every call does nothing."""

    def __init__(
        self,
        ctx: Context,
        edges: EdgeOnHost | None,
        nodes: NodesOnHost,
        bind_address: str,
    ) -> None:
        """``nodes``: the node runtime of the host a cluster's controller runs on, which
        says where the controller is; ``edges``: that host's rules."""
        self.ctx = ctx
        self.edges = edges
        self.nodes = nodes
        self.bind_address = bind_address
        # cluster id -> (host id the rules were applied on, the controller's address).
        self._applied: dict[int, tuple[int | None, str]] = {}
        # Clusters whose controller's host has no firewall we manage (logged once).
        self._unserved: dict[int, int | None] = {}
        # One sync at a time: a sync that read the store earlier must not finish after
        # (and undo) a newer one.
        self._sync_lock = threading.RLock()

    def close(self) -> None:
        """Nothing to stop: the rules stay in the hosts' kernels, so sessions outlive
        this process; the next process's first scan takes them over."""

    def drop(self, cluster_id: int, hosts: set[int | None] | None = None) -> None:
        """Delete the cluster's rules on the host they were applied on by this process
        and on ``hosts`` (where the store says they may be, should another process have
        applied them). Raises when a host's firewall cannot be changed (the delete is
        retried with the operation)."""
        if self.edges is None:
            return
        with self._sync_lock:
            applied = self._applied.get(cluster_id)
            where = set(hosts or set()) | ({applied[0]} if applied else set())
            for host_id in where:
                edge = self.edges(host_id)
                if edge is not None:
                    edge.remove(cluster_id)
            self._applied.pop(cluster_id, None)

    def sweep(self) -> None:
        """Delete the rules of clusters that should have none where they are: on every
        host that answers (and this machine), every cluster whose controller is not
        there, or that is gone. Covers what ``sync`` cannot see after a restart (a
        controller that moved to another host while no process remembered where its
        rules were). Never raises (a host that does not answer is tried next time)."""
        if self.edges is None:
            return
        with self._sync_lock:
            try:
                with self.ctx.read() as session:
                    clusters = list(
                        session.scalars(
                            select(TrainingCluster).where(
                                TrainingCluster.deleted_at.is_(None),
                                TrainingCluster.status.not_in(
                                    (TrainingStatus.DELETING, TrainingStatus.DELETED)
                                ),
                            )
                        )
                    )
                    expected = {c.id: controller_host(session, c) for c in clusters}
                    # Every host that answers (rules may be left where no live cluster
                    # runs now); one that does not is swept once it answers again.
                    reachable = session.scalars(
                        select(Host.id).where(Host.unreachable_since.is_(None))
                    )
                    used = {None, *reachable, *expected.values()}
            except Exception:
                log.exception("training edge sweep: reading the store failed")
                return
            # Several host ids may name one host's rules (None and this machine's id).
            hosts: dict[int, tuple[HostEdge, set[int]]] = {}
            for host_id in used:
                edge = self._edge_or_none(host_id)
                if edge is not None:
                    hosts.setdefault(id(edge), (edge, set()))
            for cluster_id, host_id in expected.items():
                edge = self._edge_or_none(host_id)
                if edge is not None:
                    hosts.setdefault(id(edge), (edge, set()))[1].add(cluster_id)
            for edge, wanted in hosts.values():
                try:
                    for cluster_id in edge.clusters() - wanted:
                        log.info("training cluster %s: removing its stale rules", cluster_id)
                        edge.remove(cluster_id)
                except Exception:
                    log.exception("training edge sweep failed on a host")

    def _edge_or_none(self, host_id: int | None) -> HostEdge | None:
        assert self.edges is not None
        try:
            return self.edges(host_id)
        except Exception:
            log.exception("training edge: no rules for host %s", host_id)
            return None

    def sync(self, cluster_id: int) -> None:
        """Make the rules of ``cluster_id`` match the store: its SSH port and each
        attached reserved IP reach the controller's SSH, filtered by its security
        groups (none attached: open). Never raises (a failure is logged; the next sync
        heals it)."""
        if self.edges is None:
            return
        try:
            with self._sync_lock:
                self._sync(cluster_id)
        except Exception:
            log.exception("training cluster %s: edge sync failed", cluster_id)

    def _sync(self, cluster_id: int) -> None:
        with self.ctx.read() as session:
            cluster = session.get(TrainingCluster, cluster_id)
            if (
                cluster is None
                or cluster.deleted_at is not None
                or cluster.status in (TrainingStatus.DELETING, TrainingStatus.DELETED)
            ):
                hosts = {cluster.host_id, controller_host(session, cluster)} if cluster else None
                self.drop(cluster_id, hosts)
                return
            ips = list(
                session.scalars(
                    select(ReservedIp.address).where(ReservedIp.training_cluster_id == cluster_id)
                )
            )
            attached = set(cluster.security_group_ids)
            groups = list(
                session.scalars(select(SecurityGroup).where(SecurityGroup.id.in_(attached)))
            )
            rule_sets = [secgroups.parse_rules(g.rules) for g in groups]
            ssh_port = cluster.ssh_port
            host_id = controller_host(session, cluster)
            names = NodeName(cluster_id, cluster.name_prefix)
        if len(groups) < len(attached):
            # An attached group that no longer exists must not open the cluster up
            # (no group at all means open): fail closed until the store is consistent.
            log.error("training cluster %s: an attached security group is missing", cluster_id)
            rule_sets = [[]]
        sources = secgroups.allowed_sources(rule_sets, "tcp", SSH_PORT)
        listeners: set[Listener] = {(ip, SSH_PORT) for ip in ips}
        if ssh_port:
            listeners.add((self.bind_address, ssh_port))
        previous = self._applied.get(cluster_id)
        if previous is not None and previous[0] != host_id:
            # The controller moved: its old host serves it no more. One that does not
            # answer keeps the new host waiting for nothing: the sweep removes its rules
            # once it answers again.
            try:
                self.drop(cluster_id)
            except Exception:
                log.exception("training cluster %s: rules left on host %s", cluster_id, previous[0])
                self._applied.pop(cluster_id, None)
            previous = None

        def edge_to(target: str) -> ClusterEdge:
            return ClusterEdge(
                cluster_id=cluster_id,
                target=target,
                target_port=SSH_PORT,
                listeners=frozenset(listeners),
                sources=None if sources is None else tuple(str(s) for s in sources),
                bridge=bridge_name(names.network),
            )

        edge = self.edges(host_id) if self.edges is not None else None
        if edge is None:
            if self._unserved.get(cluster_id) != host_id:  # once, not every scan
                self._unserved[cluster_id] = host_id
                log.error(
                    "training cluster %s: the firewall of host %s cannot be managed from "
                    "here (a tcp:// engine): its SSH endpoint and reserved IPs are not served",
                    cluster_id,
                    host_id,
                )
            return
        self._unserved.pop(cluster_id, None)
        # The rules apply before any engine call, so an engine that does not answer
        # cannot keep a detached IP or a new rule from taking effect.
        if previous is not None:
            edge.apply(edge_to(previous[1]))
        target = self.nodes(host_id).node_address(names.controller, names.network)
        if target is None:
            edge.remove(cluster_id)  # no controller to reach: nothing is forwarded
            self._applied.pop(cluster_id, None)
            return
        if previous is None or previous[1] != target:
            edge.apply(edge_to(target))
        self._applied[cluster_id] = (host_id, target)


def controller_host(session: Session, cluster: TrainingCluster) -> int | None:
    """The host the cluster's controller runs on: its node's host when recorded, else
    the cluster's."""
    found = session.scalars(
        select(TrainingNode.host_id).where(
            TrainingNode.cluster_id == cluster.id, TrainingNode.role == NodeRole.CONTROLLER
        )
    ).first()
    return found if found is not None else cluster.host_id
