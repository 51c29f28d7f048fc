"""A training cluster's network edge: TCP forwarders from the cluster's SSH port and its
reserved IPs to the controller's sshd, filtered by the cluster's security groups.

The store says what the edge should be; :meth:`ClusterEdges.sync` makes the forwarder
match it and is safe to call at any time (the training operator calls it after every
operation and on every scan, so a sync that failed heals). Rules and the set of
listened addresses are applied before the engine is asked anything; the forwarder
re-checks open connections against a new acl.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Protocol

from sqlalchemy import select

from gpuyard.core import secgroups
from gpuyard.core.errors import GpuyardError
from gpuyard.core.training import NodeName, TrainingStatus
from gpuyard.services.context import Context
from gpuyard.services.training import SSH_PORT
from gpuyard.store.schema import ReservedIp, SecurityGroup, TrainingCluster

log = logging.getLogger(__name__)

Listener = tuple[str, int]


class Edge(Protocol):
    """What the edge needs of net/forwarder.TcpForwarder."""

    def ensure(
        self,
        listen_host: str,
        listen_port: int,
        target_host: str,
        target_port: int,
        acl: Callable[[str, int], bool],
    ) -> None: ...
    def remove(self, listen_host: str, listen_port: int) -> None: ...
    def close(self) -> None: ...


class ControllerAddresses(Protocol):
    """What the edge needs of the node runtime: where a controller is reached."""

    def node_address(self, name: str, network: str) -> str | None: ...


# The node runtime of a host's engine (None: a cluster with no host recorded).
NodesOnHost = Callable[[int | None], ControllerAddresses]


class ClusterEdges:
    """Every training cluster's listeners and acls in this process. With no forwarder
    (``edge`` None) every call does nothing."""

    def __init__(
        self,
        ctx: Context,
        edge: Edge | None,
        nodes: NodesOnHost,
        bind_address: str,
    ) -> None:
        """``nodes``: the node runtime of the host a cluster runs on, which says where
        its controller is."""
        self.ctx = ctx
        self.edge = edge
        self.nodes = nodes
        self.bind_address = bind_address
        self._listeners: dict[int, set[Listener]] = {}
        self._acls: dict[int, list[list[secgroups.Rule]]] = {}
        self._acl_lock = threading.Lock()  # the acls are read on the forwarder's thread
        # One sync at a time: a sync that read the store earlier must not finish after
        # (and undo) a newer one.
        self._sync_lock = threading.RLock()

    def close(self) -> None:
        if self.edge is not None:
            self.edge.close()

    def drop(self, cluster_id: int, also: set[Listener] | None = None) -> None:
        """Close the cluster's listeners: those this process opened, plus ``also``
        (what the store says it may have, should another operator have opened them)."""
        if self.edge is None:
            return
        with self._sync_lock:
            for host, port in self._listeners.pop(cluster_id, set()) | (also or set()):
                self.edge.remove(host, port)
            with self._acl_lock:
                self._acls.pop(cluster_id, None)

    def sync(self, cluster_id: int) -> None:
        """Make the forwarders of ``cluster_id`` match the store: its SSH port and each
        attached reserved IP reach the controller's SSH, filtered by its security
        groups (none attached: open). Never raises (a failure is logged; the next sync
        heals it)."""
        if self.edge is None:
            return
        try:
            with self._sync_lock:
                self._sync(cluster_id)
        except Exception:
            log.exception("training cluster %s: edge sync failed", cluster_id)

    def _sync(self, cluster_id: int) -> None:
        assert self.edge is not None
        edge = self.edge
        with self.ctx.read() as session:
            cluster = session.get(TrainingCluster, cluster_id)
            if (
                cluster is None
                or cluster.deleted_at is not None
                or cluster.status in (TrainingStatus.DELETING, TrainingStatus.DELETED)
            ):
                self.drop(cluster_id)
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
            host_id = cluster.host_id
            names = NodeName(cluster_id, cluster.name_prefix)
        if len(groups) < len(attached):
            # An attached group that no longer exists must not open the cluster up
            # (no group at all means open): fail closed until the store is consistent.
            log.error("training cluster %s: an attached security group is missing", cluster_id)
            rule_sets = [[]]
        # The rules and the set of addresses apply before any engine call, so an engine
        # that does not answer cannot keep a detached IP or a new rule from taking effect.
        with self._acl_lock:
            self._acls[cluster_id] = rule_sets
        addresses: set[Listener] = {(ip, SSH_PORT) for ip in ips}
        if ssh_port:
            addresses.add((self.bind_address, ssh_port))
        held = self._listeners.setdefault(cluster_id, set())

        def keep_only(keep: set[Listener]) -> None:
            for listener in held - keep:
                edge.remove(*listener)
                held.discard(listener)

        keep_only(addresses)
        target = self.nodes(host_id).node_address(names.controller, names.network)
        if target is None:
            keep_only(set())  # no controller to reach: nothing listens
            return

        def acl(source: str, _listen_port: int) -> bool:
            with self._acl_lock:
                sets = self._acls.get(cluster_id, [])
            return secgroups.allows(sets, "tcp", SSH_PORT, source)

        failed: list[str] = []
        for host, port in addresses:
            try:
                edge.ensure(host, port, target, SSH_PORT, acl)
            except GpuyardError as exc:  # one address not assignable: keep the others
                failed.append(exc.message)
                continue
            held.add((host, port))
        if failed:
            log.error("training cluster %s: %s", cluster_id, "; ".join(failed))
