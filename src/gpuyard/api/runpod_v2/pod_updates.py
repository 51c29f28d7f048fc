"""``PATCH /runpod/v2/pods/{id}`` over gpuyard's use cases.

A new name is services/clusters/actions.py ``rename_cluster``. Container settings
(image, env, ports, the volume's size) change in gpuyard only with a start
(``start_cluster`` with a ``StartCluster``'s changes), so a PATCH of them restarts the
pod with them, as RunPod resets a pod whose container settings change: a running pod
is stopped and started again (the start waits for the stop), a stopped or failed one
is started. The changes are checked against the pod before anything stops. What
gpuyard cannot change after a create is refused unless it is the current value.
"""

from __future__ import annotations

from pydantic import ValidationError as PydanticError

from gpuyard.api.runpod_v2.pod_requests import port_specs, registry_id, renamed
from gpuyard.api.runpod_v2.pod_schemas import UpdatePodRequest
from gpuyard.core.errors import InvalidState, ValidationFailed
from gpuyard.core.models import PortSpec
from gpuyard.core.secret_env import masked_env
from gpuyard.core.states import ClusterStatus
from gpuyard.services.clusters import use_cases as uc
from gpuyard.services.clusters.config import ports_of, start_changes
from gpuyard.services.clusters.requests import ConfigurationUpdate, StartCluster
from gpuyard.services.context import Context
from gpuyard.services.tenancy.auth import Principal
from gpuyard.services.tenancy.secrets import secret_box
from gpuyard.store.schema import Cluster

_STARTING = (ClusterStatus.PENDING, ClusterStatus.STARTING)


def _fixed(field: str, what: str) -> ValidationFailed:
    return ValidationFailed(field, f"gpuyard cannot change a pod's {what} after its create")


def refuse_fixed(cluster: Cluster, body: UpdatePodRequest) -> None:
    """Raise ValidationFailed for a field sent that gpuyard cannot change (a value
    equal to the current one is no change)."""
    sent = body.model_fields_set
    if body.args is not None and body.args != cluster.docker_args:
        raise _fixed("args", "args (create a new pod with them)")
    if body.disk is not None and body.disk != cluster.container_disk_gb:
        raise _fixed("disk", "container disk")
    if "registry" in sent and registry_id(body.registry) != cluster.registry_auth_id:
        raise _fixed("registry", "registry credential")
    if body.locked:
        raise ValidationFailed("locked", "gpuyard does not lock pods")
    if body.globalNetworking:
        raise ValidationFailed("globalNetworking", "gpuyard has no global networking")
    if body.templateId:
        raise ValidationFailed("templateId", "gpuyard applies a template at a pod's create only")
    mounts = body.mounts
    if mounts is None:
        return
    for network in mounts.network or []:
        if network.volumeId != cluster.network_volume_id:
            raise _fixed("mounts.network", "network volume")
        if network.path != cluster.volume_mount_path:
            raise _fixed("mounts.network", "mount path")
    if mounts.network == [] and cluster.network_volume_id is not None:
        raise _fixed("mounts.network", "network volume")
    persistent = mounts.persistent
    if persistent is not None:
        if cluster.network_volume_id is not None:
            raise _fixed("mounts.persistent", "volume (it mounts a network volume)")
        if persistent.path != cluster.volume_mount_path:
            raise _fixed("mounts.persistent.path", "mount path")


def _env_updates(cluster: Cluster, env: dict[str, str]) -> dict[str, str | None]:
    """The whole new env as updates: changed values, and removals of what it leaves
    out (a secret's mask sent back is no change)."""
    shown = masked_env(cluster.env)
    updates: dict[str, str | None] = {k: v for k, v in env.items() if shown.get(k) != v}
    updates.update({k: None for k in cluster.env if k not in env})
    return updates


def _port_updates(cluster: Cluster, ports: list[str]) -> list[PortSpec]:
    current = {(p.internal_port, p.transport): p for p in ports_of(cluster)}
    wanted = [PortSpec.model_validate(spec) for spec in port_specs(ports)]
    keys = {(p.internal_port, p.transport) for p in wanted}
    gone = sorted(
        f"{port}/{transport}" for port, transport in current if (port, transport) not in keys
    )
    if gone:
        raise ValidationFailed("ports", f"gpuyard cannot remove a pod's ports ({', '.join(gone)})")
    out = []
    for p in wanted:
        old = current.get((p.internal_port, p.transport))
        if old is None or old.protocol != p.protocol:
            out.append(p)
    return out


def start_for(cluster: Cluster, body: UpdatePodRequest) -> StartCluster | None:
    """The start that applies ``body``'s container settings; None when they change
    nothing."""
    image = body.image if body.image is not None and body.image != cluster.image else None
    size = None
    persistent = body.mounts.persistent if body.mounts is not None else None
    if persistent is not None and persistent.size != cluster.volume_gb:
        size = persistent.size
    env = _env_updates(cluster, body.env) if body.env is not None else {}
    ports = _port_updates(cluster, body.ports) if body.ports is not None else []
    if image is None and size is None and not env and not ports:
        return None
    update = (
        ConfigurationUpdate(docker_image=image, storage_gb=size)
        if image is not None or size is not None
        else None
    )
    try:
        return StartCluster(
            update_configuration=update,
            environment_updates=env or None,
            port_mapping_updates=ports or None,
        )
    except PydanticError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first.get("loc", ())) or "body"
        raise ValidationFailed(field, str(first.get("msg", "invalid"))) from None


def apply(ctx: Context, principal: Principal, pod_id: str, body: UpdatePodRequest) -> None:
    """Make the changes ``body`` asks of the pod (see the module). Raises
    ValidationFailed naming the pod's field, InvalidState (starting, terminated),
    ClusterNotFound."""
    cluster = uc.get_cluster(ctx, principal, pod_id)
    refuse_fixed(cluster, body)
    try:
        start = start_for(cluster, body)
        if start is not None:
            status = ClusterStatus(cluster.status)
            if status in _STARTING:
                raise InvalidState(
                    f"pod {pod_id} is starting: change its container settings once it runs "
                    "or is stopped",
                    {"status": status.value},
                )
            if status in (ClusterStatus.TERMINATING, ClusterStatus.TERMINATED):
                raise InvalidState(f"pod {pod_id} is terminated", {"status": status.value})
            # Refused here, before the pod stops, rather than at its start.
            start_changes(cluster, start, secret_box(ctx.settings))
        if body.name is not None and body.name != cluster.name:
            uc.rename_cluster(ctx, principal, pod_id, body.name)
        if start is not None:
            if cluster.status == ClusterStatus.RUNNING.value:
                uc.stop_cluster(ctx, principal, pod_id)
            uc.start_cluster(ctx, principal, pod_id, start)
    except ValidationFailed as exc:
        raise renamed(exc) from None
