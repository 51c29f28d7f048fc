"""What the training API shows of a cluster (seed 002's cluster object)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpuyard.core.billing.pricing import Prices, hourly_rate
from gpuyard.core.models import CloudType
from gpuyard.core.training import clusters as domain
from gpuyard.core.training.clusters import LIFECYCLE_LOG, NodeName, NodeRole, TrainingStatus
from gpuyard.services.catalog.gpu_types import find_gpu_type
from gpuyard.services.training.nodes import nodes_of
from gpuyard.store.schema import Host, ImageVersion, ReservedIp, SecurityGroup, TrainingCluster


def _iso(t: datetime | None) -> str | None:
    return None if t is None else t.isoformat().replace("+00:00", "Z")


def _reachability(host: Host | None) -> str | None:
    """What the heartbeats say of a node's host, spelled as a cluster's ``host_status``."""
    if host is None:
        return None
    return "reachable" if host.unreachable_since is None else "unreachable"


def node_rates(session: Session, cluster: TrainingCluster, prices: Prices) -> dict[str, float]:
    """Hourly price of one worker and of the controller (on-demand, secure)."""
    gpu = find_gpu_type(session, cluster.gpu_type)

    def rate(gpus: int, cpus: int, memory: int) -> float:
        parts = hourly_rate(
            gpu=gpu if gpus else None,
            gpu_count=gpus,
            cpu_cores=cpus,
            memory_gb=memory,
            container_disk_gb=0,
            volume_gb=0,
            cloud_type=CloudType.SECURE,
            running=True,
            prices=prices,
        )
        return round(parts.gpu + parts.compute + parts.container_disk + parts.volume, 6)

    return {
        "worker": rate(cluster.gpus_per_node, cluster.cpus_per_node, cluster.memory_gb_per_node),
        "controller": rate(0, domain.CONTROLLER_VCPUS, domain.CONTROLLER_MEMORY_GB),
    }


def cluster_view(
    session: Session,
    cluster: TrainingCluster,
    *,
    prices: Prices,
    public_address: str | None,
    partition: list[tuple[str, str]] | None,
    auto_terminate: dict[str, Any],
) -> dict[str, Any]:
    """Seed 002's cluster object (``auto_terminate``: services/training/autoterm.py
    ``policy_view``, an extension)."""
    nodes = nodes_of(session, cluster.id)
    hosts = {
        h.id: h
        for h in session.scalars(
            select(Host).where(Host.id.in_({n.host_id for n in nodes if n.host_id}))
        )
    }
    image = session.get(ImageVersion, cluster.image_version_id)
    groups = list(
        session.scalars(
            select(SecurityGroup).where(SecurityGroup.id.in_(cluster.security_group_ids))
        )
    )
    ips = list(
        session.scalars(select(ReservedIp).where(ReservedIp.training_cluster_id == cluster.id))
    )
    rates = node_rates(session, cluster, prices)
    workers = [n for n in nodes if n.role == NodeRole.WORKER]
    # SSH is served by the host the controller runs on (runtimes/hosts/edge.py): its
    # address; this machine's is the public address when one is set.
    controller = next((n for n in nodes if n.role == NodeRole.CONTROLLER), None)
    host_id = controller.host_id if controller and controller.host_id else cluster.host_id
    host = hosts.get(host_id) if host_id else None
    ssh_host = host.address if host else public_address
    ssh = None
    if cluster.ssh_port and ssh_host:
        ssh = {
            "host": ssh_host,
            "port": cluster.ssh_port,
            "user": "root",
            "command": f"ssh -p {cluster.ssh_port} root@{ssh_host}",
        }
    status = TrainingStatus(cluster.status)
    return {
        "id": cluster.id,
        "name": cluster.name,
        "project_id": cluster.project_id,
        "location": cluster.location,
        "status": cluster.status,
        "status_reason": cluster.status_reason,
        "error_message": cluster.error_message,
        "no_of_nodes": len(workers),
        "image_version": {
            "id": cluster.image_version_id,
            "name": image.name if image else None,
            "version": image.version if image else None,
        },
        "plan": {
            "sku_id": cluster.sku_id,
            "gpu_type": cluster.gpu_type,
            "gpus_per_node": cluster.gpus_per_node,
            "cpus_per_node": cluster.cpus_per_node,
            "memory_gb_per_node": cluster.memory_gb_per_node,
            "price_per_node_hour": rates["worker"],
        },
        # What the cluster bills now: nothing while it is stopped (the plan keeps its price).
        "price_per_hour": (
            0.0
            if status in domain.AT_REST
            else round(rates["controller"] + rates["worker"] * len(workers), 6)
        ),
        "controller": NodeName(cluster.id, cluster.name_prefix).controller,
        "network": {"subnet": cluster.subnet},
        "ssh": ssh,
        "nodes": [
            {
                "id": n.id,
                "name": n.name,
                "role": n.role,
                "status": n.status,
                "host_id": n.host_id,
                "host": hosts[n.host_id].name if n.host_id in hosts else None,
                # "unreachable": the node's host missed its heartbeats; the node keeps
                # its GPUs and bills nothing until the host answers again.
                "host_status": _reachability(hosts.get(n.host_id) if n.host_id else None),
                # Its fixed address on the cluster's own network, the same on every host
                # (None: a cluster made before clusters spanned hosts).
                "private_ip": n.address,
                "gpu_indices": list(n.gpu_indices),
                "image_version_id": n.image_version_id,
                # How often the operator recreated the node's container after it died.
                "restarts": n.restarts,
                "lifecycle": (
                    {
                        "status": n.lifecycle_status,
                        "exit_code": n.lifecycle_exit_code,
                        "log": LIFECYCLE_LOG,
                    }
                    if n.lifecycle_status
                    else None
                ),
            }
            for n in nodes
        ],
        "slurm": {
            "partition": "gpu",
            "available": partition is not None,
            "nodes": [{"name": name, "state": state} for name, state in (partition or [])],
        },
        "reserved_ips": [{"id": ip.id, "address": ip.address} for ip in ips],
        "security_groups": [{"id": g.id, "name": g.name} for g in groups],
        "ssh_key_ids": list(cluster.ssh_key_ids),
        "lifecycle_script": cluster.lifecycle_script is not None,
        "allowed_actions": domain.allowed_actions(status),
        "auto_terminate": auto_terminate,
        "created_at": _iso(cluster.created_at),
        "updated_at": _iso(cluster.updated_at),
    }
