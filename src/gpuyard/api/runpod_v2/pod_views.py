"""RunPod v2's ``Pod``: a gpuyard cluster as RunPod's REST v2 shows a pod.

Pure functions of the cluster view (services/clusters/views.py ``ClusterDetails``):
the status mapping (:func:`pod_status`), what may be done now (:func:`pod_actions`),
the address clients reach (:func:`reachable_address`) and the whole answer
(:func:`pod_json`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from gpuyard.api.rest.schemas.cluster_json import iso
from gpuyard.core.secret_env import masked_env
from gpuyard.core.states import ClusterStatus, allowed_actions
from gpuyard.services.clusters.views import AssignedPort, ClusterDetails

PROVISIONING = "PROVISIONING"
STARTING = "STARTING"
RUNNING = "RUNNING"
EXITED = "EXITED"
ERROR = "ERROR"
TERMINATED = "TERMINATED"
POD_STATUSES = (PROVISIONING, STARTING, RUNNING, EXITED, ERROR, TERMINATED)

_STATUS: dict[ClusterStatus, str] = {
    # Accepted, waiting for its host (a deferred placement): not yet starting.
    ClusterStatus.PENDING: PROVISIONING,
    ClusterStatus.STARTING: STARTING,
    ClusterStatus.RUNNING: RUNNING,
    # On its way to EXITED, and already refusing what a running pod allows.
    ClusterStatus.STOPPING: EXITED,
    ClusterStatus.STOPPED: EXITED,
    ClusterStatus.ERROR: ERROR,
    # Going away: nothing more can be done with it.
    ClusterStatus.TERMINATING: TERMINATED,
    ClusterStatus.TERMINATED: TERMINATED,
}


def pod_status(status: ClusterStatus) -> str:
    """RunPod's ``PodStatus`` of a cluster in ``status``."""
    return _STATUS[status]


def cluster_statuses(pod: str) -> tuple[ClusterStatus, ...]:
    """The cluster statuses that show as ``pod`` (the inverse of :func:`pod_status`)."""
    return tuple(s for s in ClusterStatus if _STATUS[s] == pod)


def pod_actions(status: ClusterStatus) -> list[str]:
    """What ``POST /pods/{id}/action`` accepts now: gpuyard's allowed actions, whose
    names are RunPod's."""
    return [a.value for a in allowed_actions(status)]


def reachable_address(view: ClusterDetails) -> str | None:
    """The address clients reach the pod's published ports at: the host's client
    address (its ``address`` unless the operator set one). The one place that says so."""
    return view.client_address or view.host_address


def _port_text(p: AssignedPort) -> str:
    return f"{p.internal_port}/{p.protocol}"


def _published(p: AssignedPort) -> bool:
    """Whether the port answers on the host's address (a private http port answers
    only through the HTTP proxy)."""
    return bool(p.external_port) and not (p.protocol == "http" and p.visibility != "public")


def ssh_port(view: ClusterDetails) -> int | None:
    """The host port 22/tcp is published on, if it is."""
    for p in view.ports:
        if p.internal_port == 22 and p.protocol == "tcp" and p.external_port:
            return p.external_port
    return None


def _endpoint(host: str, port: int, user: str) -> dict[str, Any]:
    return {
        "host": host,
        "port": port,
        "username": user,
        "command": f"ssh {user}@{host} -p {port}",
    }


def pod_ssh(view: ClusterDetails) -> dict[str, Any]:
    """``proxy``: gpuyard's SSH gateway (user: the pod's id) when it is on; ``direct``:
    the container's own sshd on the published port of 22/tcp. Each null unless the
    pod runs and can be reached that way."""
    running = view.cluster.status == ClusterStatus.RUNNING
    address = reachable_address(view)
    gateway = view.ssh_gateway if running and address else None
    port = ssh_port(view) if running else None
    return {
        "proxy": _endpoint(gateway[0], gateway[1], view.cluster.id) if gateway else None,
        "direct": _endpoint(address, port, "root") if address and port else None,
    }


def pod_mounts(view: ClusterDetails) -> dict[str, Any]:
    """``persistent``: the pod's own volume; ``network``: the network volume mounted
    instead (gpuyard mounts one or the other at the mount path)."""
    c = view.cluster
    if c.network_volume_id is not None:
        return {"network": [{"volumeId": c.network_volume_id, "path": c.volume_mount_path}]}
    if c.volume_gb > 0:
        return {"persistent": {"size": c.volume_gb, "path": c.volume_mount_path}}
    return {}


def pod_runtime(view: ClusterDetails, now: datetime) -> dict[str, Any] | None:
    """Null unless running: how long it has run and where each port answers
    (``public`` null for a port reached only through the HTTP proxy)."""
    c = view.cluster
    if c.status != ClusterStatus.RUNNING:
        return None
    address = reachable_address(view)
    started = c.started_at or c.start_initiated_at
    uptime = 0
    if started is not None:
        ran = now.replace(tzinfo=None) - started.replace(tzinfo=None)
        uptime = max(0, int(ran.total_seconds()))
    return {
        "uptime": uptime,
        "ports": [
            {
                "private": p.internal_port,
                "public": p.external_port if _published(p) else None,
                "type": p.protocol,
                "ip": address if _published(p) else None,
            }
            for p in view.ports
        ],
    }


def _memory_of_cpu(view: ClusterDetails) -> int:
    return max(1, view.cluster.memory_gb)


def pod_json(view: ClusterDetails, now: datetime) -> dict[str, Any]:
    """The ``Pod`` of RunPod's v2 document, for one cluster view."""
    c = view.cluster
    status = ClusterStatus(c.status)
    body: dict[str, Any] = {
        "id": c.id,
        "name": c.name,
        "status": pod_status(status),
        "actions": pod_actions(status),
        "image": c.image,
        "args": c.docker_args,
        "disk": c.container_disk_gb,
        "env": masked_env(c.env),
        "ports": [_port_text(p) for p in view.ports],
        "registry": str(c.registry_auth_id) if c.registry_auth_id is not None else None,
        "mounts": pod_mounts(view),
        "cloud": c.cloud_type if c.cloud_type in ("SECURE", "COMMUNITY") else "SECURE",
        "dataCenterId": view.host_location,
        # gpuyard's hosts do not report their CUDA version (yet).
        "cudaVersion": None,
        "ssh": pod_ssh(view),
        "template": c.template_id,
        "cost": 0.0 if pod_status(status) == TERMINATED else float(view.rate.total),
        # gpuyard has no pod locks nor global networking: always off.
        "locked": False,
        "globalNetworking": {"enabled": False},
        "runtime": pod_runtime(view, now),
        "createdAt": iso(c.created_at),
        "startedAt": iso(c.started_at),
        # gpuyard's own: spot pods (RunPod's interruptible ones) and their bid.
        "interruptible": bool(c.interruptible),
        "bidPerGpu": c.bid_per_gpu,
    }
    if c.gpu_count > 0:
        body["gpu"] = {"id": c.gpu_type or "", "count": c.gpu_count}
    else:
        body["cpu"] = {"id": "cpu", "vcpuCount": c.cpu_cores, "memory": _memory_of_cpu(view)}
    return body
