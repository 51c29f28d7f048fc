"""Which SSH keys a training cluster's nodes hold, and keeping them so.

The cluster's SSH port is forwarded straight to the controller's sshd
(reconciler/training/edge.py), so the gateway's per-login check never sees those logins: the
nodes' ``authorized_keys`` must themselves hold only the keys that open the cluster
now. A key the cluster names (``ssh_key_ids``) is installed while it is a key of the
cluster's account whose user may write to the cluster's project
(services/tenancy/cluster_access.py; only its own project for a key registered through a
project-restricted API key). A key with no user opens nothing.

:class:`NodeKeys` keeps running nodes in line: the operator's scan asks
:meth:`NodeKeys.stale` (no engine call: it compares digests of what this process
installed per node) and queues :meth:`NodeKeys.refresh` for a cluster whose keys
changed — a member removed, their API keys revoked, their projects narrowed, a key
deleted — which installs the new set into each running node that lacks it.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpuyard.core.training.clusters import TrainingStatus
from gpuyard.services.tenancy.cluster_access import AccessIndex, Need
from gpuyard.store.schema import SshKey, TrainingCluster, TrainingNode

if TYPE_CHECKING:
    from gpuyard.reconciler.training.steps import OperatorSteps

log = logging.getLogger(__name__)


def node_keys_text(session: Session, clusters: Sequence[TrainingCluster]) -> dict[int, str]:
    """For each cluster, the ``authorized_keys`` text its nodes hold now (module
    docstring): the opening keys it names, in the order it names them."""
    ids = {int(i) for c in clusters for i in (c.ssh_key_ids or [])}
    keys = (
        {k.id: k for k in session.scalars(select(SshKey).where(SshKey.id.in_(ids)))} if ids else {}
    )
    access = AccessIndex.load(session, [k.user_id for k in keys.values() if k.user_id is not None])
    out = {}
    for cluster in clusters:
        lines = []
        for key_id in cluster.ssh_key_ids or []:
            key = keys.get(int(key_id))
            if (
                key is not None
                and key.account_id == cluster.account_id
                and access.user_may(
                    key.user_id,
                    cluster.account_id,
                    cluster.project_id,
                    Need.WRITE,
                    within_project=key.project_id,
                )
            ):
                lines.append(key.public_key.strip() + "\n")
        out[cluster.id] = "".join(lines)
    return out


def text_digest(keys_text: str) -> str:
    return hashlib.sha256(keys_text.encode()).hexdigest()


class NodeKeys:
    """What this process installed in each node (a digest per node name), and the
    pass that brings running nodes in line. Nothing is known after a restart, so the
    first pass installs once into every running node."""

    def __init__(self, op: OperatorSteps) -> None:
        self.op = op
        self._installed: dict[int, dict[str, str]] = {}
        self._lock = threading.Lock()

    def stale(self, cluster_id: int, node_names: Iterable[str], keys_text: str) -> bool:
        """Whether a node of the cluster may lack ``keys_text`` (not installed by this
        process since the cluster's last operation, or another text)."""
        digest = text_digest(keys_text)
        with self._lock:
            known = self._installed.get(cluster_id, {})
            return any(known.get(name) != digest for name in node_names)

    def forget(self, cluster_id: int) -> None:
        """After an operation (nodes made or restarted from its snapshot) or a delete:
        the next pass checks every node again."""
        with self._lock:
            self._installed.pop(cluster_id, None)

    def scan(self, session: Session) -> list[int]:
        """The running clusters with no operation whose nodes may hold other keys
        than they should now (one read of clusters, nodes and keys for all)."""
        clusters = [
            c
            for c in session.scalars(
                select(TrainingCluster).where(
                    TrainingCluster.deleted_at.is_(None),
                    TrainingCluster.status == TrainingStatus.RUNNING,
                )
            )
            # In Python: a JSON column's "none" may be stored as JSON null.
            if c.operation is None
        ]
        if not clusters:
            return []
        names: dict[int, list[str]] = {c.id: [] for c in clusters}
        for cluster_id, name in session.execute(
            select(TrainingNode.cluster_id, TrainingNode.name).where(
                TrainingNode.cluster_id.in_(list(names))
            )
        ):
            names[int(cluster_id)].append(str(name))
        texts = node_keys_text(session, clusters)
        return [c.id for c in clusters if self.stale(c.id, names[c.id], texts[c.id])]

    def refresh(self, cluster_id: int) -> None:
        """Install the keys that open the cluster now into each of its running nodes
        that does not hold them (a no-op unless it is running with no operation). A
        node not running, or whose install fails, is tried again at the next pass
        (a recreated node gets the keys in its files; a restarted one the ones last
        installed)."""
        snap = self.op.snapshot(cluster_id)
        if snap is None or snap.operation is not None:
            return
        if snap.cluster.status != TrainingStatus.RUNNING:
            return
        digest = text_digest(snap.keys_text)
        nodes = self.op.nodes_of(snap)
        for node in snap.nodes:
            with self._lock:
                if self._installed.get(cluster_id, {}).get(node.name) == digest:
                    continue
            try:
                if nodes.node_state(node.name) != "running":
                    continue
                nodes.install_authorized_keys(node.name, snap.keys_text)
            except Exception as exc:  # engine down, node gone meanwhile: next pass
                log.warning("training node %s: SSH keys not installed: %s", node.name, exc)
                continue
            with self._lock:
                self._installed.setdefault(cluster_id, {})[node.name] = digest
