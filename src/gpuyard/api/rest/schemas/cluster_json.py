"""JSON shapes of clusters for REST v1 and v2."""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime
from typing import Any

from gpuyard.core.autoterm import shown_policy
from gpuyard.core.billing.ledger import MICRO
from gpuyard.core.progress import progress_for
from gpuyard.core.secret_env import masked_env
from gpuyard.core.snapshots import percentage as snapshot_percentage
from gpuyard.core.states import ClusterStatus, allowed_actions
from gpuyard.services.clusters.views import ClusterDetails
from gpuyard.store.schema import Cluster, Event


def iso(t: datetime | None) -> str | None:
    """UTC time as ``2024-01-15T16:00:00Z`` (isoformat is several times faster than
    strftime, and cluster objects carry six timestamps)."""
    return t.replace(tzinfo=None).isoformat(timespec="seconds") + "Z" if t else None


def event(e: Event) -> dict[str, Any]:
    """One status change (or other event) of a cluster or training cluster."""
    return {
        "id": e.id,
        "at": iso(e.created_at),
        "type": e.type,
        "from_status": e.from_status,
        "to_status": e.to_status,
        "message": e.message,
    }


_NO_PROXY = (ClusterStatus.TERMINATING, ClusterStatus.TERMINATED)


def proxy_url(d: ClusterDetails, internal_port: int) -> str | None:
    """The port's address on the HTTP proxy: stable for the cluster's life (a stopped
    cluster's answers a page saying so); None once it is terminated or while the
    proxy does not serve (the hosts view says why)."""
    if d.proxy is None or d.cluster.status in _NO_PROXY:
        return None
    return d.proxy.url(d.cluster.id, internal_port)


def network(d: ClusterDetails) -> dict[str, Any]:
    running = d.cluster.status == ClusterStatus.RUNNING
    ports = [
        {
            "internal_port": p.internal_port,
            "external_port": p.external_port,
            "protocol": p.protocol,
            "description": p.description,
            # A private http port answers only through the proxy (published on its
            # host's loopback): no address of its own to show.
            "address": f"{d.host_address}:{p.external_port}"
            if d.host_address
            and p.external_port
            and not (p.protocol == "http" and p.visibility != "public")
            else None,
            "visibility": p.visibility,
            "proxy_url": proxy_url(d, p.internal_port) if p.protocol == "http" else None,
        }
        for p in d.ports
    ]
    http = next((p for p in d.ports if p.protocol == "http"), None)
    ssh = next((p for p in d.ports if p.internal_port == 22 and p.protocol != "udp"), None)
    reachable = running and d.host_address is not None
    return {
        "ip": d.host_address,
        "ports": ports,
        "proxy_url": proxy_url(d, http.internal_port) if http else None,
        "ssh_connection": ssh_connection(d, reachable, ssh.external_port if ssh else None),
    }


def ssh_connection(d: ClusterDetails, reachable: bool, ssh_port: int | None) -> dict[str, Any]:
    """How to SSH in: through the gateway (``ssh CLUSTER@HOST -p 2222``, any running
    cluster) and, when 22/tcp is published, straight to the container's sshd
    (``direct``). host/port/username/connection_string name the gateway when it is
    on, else the direct way; all null unless the cluster runs on a reachable host."""
    gateway = d.ssh_gateway if reachable else None
    direct = d.host_address if reachable and ssh_port else None
    via = (
        (gateway[0], gateway[1], d.cluster.id)
        if gateway
        else (direct, ssh_port, "root")
        if direct
        else None
    )
    return {
        "host": via[0] if via else None,
        "port": via[1] if via else None,
        "username": via[2] if via else None,
        "connection_string": f"ssh {via[2]}@{via[0]} -p {via[1]}" if via else None,
        "gateway": f"ssh {d.cluster.id}@{gateway[0]} -p {gateway[1]}" if gateway else None,
        "direct": f"ssh root@{direct} -p {ssh_port}" if direct else None,
    }


def cost(d: ClusterDetails) -> dict[str, Any]:
    a = d.accrual
    return {
        "hourly_rate": d.rate.total,
        "currency": "USD",
        "breakdown": {
            "gpu": d.rate.gpu,
            "compute": d.rate.compute,
            "container_disk": d.rate.container_disk,
            "volume": d.rate.volume,
        },
        "accrued_usd": {
            "current_run": a.current_run_micro / MICRO if a else 0.0,
            "lifetime": a.lifetime_micro / MICRO if a else 0.0,
        },
        "since": iso(d.cluster.start_initiated_at),
    }


def auto_terminate(d: ClusterDetails) -> dict[str, Any]:
    """The stored policy, plus what fires next and when (null when nothing will) and
    ``error``: why a stored policy is not enforced (null when it is valid)."""
    nxt = d.next_auto_terminate
    return {
        **shown_policy(d.cluster.auto_terminate),
        "error": d.auto_terminate_error,
        "next_deadline_at": iso(nxt.at) if nxt else None,
        "next_rule": nxt.rule.value if nxt else None,
        "next_action": nxt.action if nxt else None,
    }


def volume(d: ClusterDetails) -> dict[str, Any] | None:
    """What is mounted at the mount path: the cluster's own volume, or the network
    volume it names (whose size is shown; the cluster's own ``volume_gb`` is then 0),
    with the bytes used when last measured (null: not yet). Null when it has none."""
    c = d.cluster
    nv = d.network_volume
    if c.network_volume_id is None and c.volume_gb <= 0:
        return None
    used, measured = c.volume_used_bytes, c.volume_measured_at
    if used is None and nv is not None:
        used, measured = nv.used_bytes, nv.measured_at
    return {
        "size_gb": c.volume_gb if c.network_volume_id is None else (nv.size_gb if nv else 0),
        "mount_path": c.volume_mount_path,
        "used_bytes": used,
        "measured_at": iso(measured),
        "network_volume_id": c.network_volume_id,
    }


def last_exit(c: Cluster) -> dict[str, Any] | None:
    """The last time the container died on its own and was (or will be) brought back:
    its exit code (null: it disappeared), when that was seen, when it was restarted."""
    if c.last_exit_code is None and not c.recent_failures and c.last_restart_at is None:
        return None
    seen = datetime.fromisoformat(str(c.recent_failures[-1])) if c.recent_failures else None
    return {
        "exit_code": c.last_exit_code,
        "seen_at": iso(seen),
        "restarted_at": iso(c.last_restart_at),
        "next_restart_at": iso(c.next_restart_at),
    }


def cluster_v1(d: ClusterDetails) -> dict[str, Any]:
    c = d.cluster
    status = ClusterStatus(c.status)
    body: dict[str, Any] = {
        "id": c.id,
        "name": c.name,
        "project_id": c.project_id,
        "status": status.value,
        "desired_status": c.desired_status,
        # A serverless worker is its endpoint's scaler's to start and stop.
        "actions": ([] if c.serverless_endpoint_id else [a.value for a in allowed_actions(status)]),
        "last_status_change": c.status_reason,
        "error_message": c.error_message,
        "restarts": c.restarts,
        "last_exit": last_exit(c),
        "docker_image": c.image,
        "docker_args": c.docker_args,
        "docker_entrypoint": (
            list(c.docker_entrypoint) if c.docker_entrypoint is not None else None
        ),
        "min_cuda_version": c.min_cuda_version,
        "allowed_cuda_versions": (
            list(c.allowed_cuda_versions) if c.allowed_cuda_versions is not None else None
        ),
        "template_id": c.template_id,
        "registry_auth_id": c.registry_auth_id,
        "serverless_endpoint_id": c.serverless_endpoint_id,
        "gpu_type": c.gpu_type,
        "gpu_display_name": d.gpu_display_name,
        "gpu_count": c.gpu_count,
        "gpu_indices": list(c.gpu_indices),
        "cpu_cores": c.cpu_cores,
        "memory_gb": c.memory_gb,
        "container_disk_gb": c.container_disk_gb,
        "volume_gb": c.volume_gb,
        "storage_gb": c.volume_gb,
        "volume_mount_path": c.volume_mount_path,
        "volume": volume(d),
        "cloud_type": c.cloud_type,
        "interruptible": bool(c.interruptible),
        "bid_per_gpu": c.bid_per_gpu,
        "env": masked_env(c.env),
        "ports": [
            {
                "internal_port": p.internal_port,
                "external_port": p.external_port,
                "protocol": p.protocol,
                "description": p.description,
                "visibility": p.visibility,
            }
            for p in d.ports
        ],
        "auto_terminate": auto_terminate(d),
        "host": {
            "id": c.host_id,
            "name": d.host_name,
            "location": d.host_location,
            "gpu_source": d.gpu_source,
            "status": d.host_status,
            "reachability": d.host_reachability,
        }
        if c.host_id is not None
        else None,
        # "unreachable": the host's engine has missed its heartbeats; the cluster keeps
        # its GPUs and bills nothing until the host answers again.
        "host_status": d.host_reachability,
        "network": network(d),
        "cost": cost(d),
        "created_at": iso(c.created_at),
        "updated_at": iso(c.updated_at),
        "start_initiated_at": iso(c.start_initiated_at),
        "started_at": iso(c.started_at),
        "stopped_at": iso(c.stopped_at),
        "terminated_at": iso(c.terminated_at),
    }
    if status in (ClusterStatus.STARTING, ClusterStatus.PENDING):
        progress = asdict(progress_for(c.startup_step))
        if d.move is not None:
            # The volume is being copied from the cluster's old host to this one.
            progress["current_step"] = "Moving volume"
            progress["moving_volume"] = {
                "from_host_id": d.move.from_host_id,
                "to_host_id": d.move.to_host_id,
                "bytes_copied": d.move.bytes_copied,
                "started_at": iso(d.move.started_at),
            }
        if d.restore is not None:
            # A snapshot is restored into a new volume that replaces the old one.
            waiting = d.restore.after_snapshot_id
            progress["current_step"] = (
                "Waiting for snapshot"
                if waiting and not d.restore.total_bytes
                else "Restoring snapshot"
            )
            progress["restoring_snapshot"] = {
                "snapshot_id": d.restore.snapshot_id,
                "bytes_restored": d.restore.bytes_done,
                "total_bytes": d.restore.total_bytes,
                "percentage": snapshot_percentage(d.restore.bytes_done, d.restore.total_bytes),
                "started_at": iso(d.restore.started_at),
                "waiting_for_snapshot": waiting if not d.restore.total_bytes else None,
            }
        body["startup_progress"] = progress
        body["estimated_ready_at"] = iso(d.estimated_ready_at)
    return body


def cluster_v2(d: ClusterDetails) -> dict[str, Any]:
    c = d.cluster
    return {
        "id": c.id,
        "name": c.name,
        "status": c.status,
        "gpuType": c.gpu_type,
        "gpuCount": c.gpu_count,
        "containerDiskSize": c.container_disk_gb,
        "volumeSize": c.volume_gb,
        "createdAt": iso(c.created_at),
    }
