"""A cluster's configuration as stored, and the changes a start may make to it.

``ports`` is stored as JSON: each port's spec plus the host port it got
(``host_port``), so reads need not join the port claims (which stay the source of
truth). A start (seed 000 ``POST /clusters/{id}/start``) may change the image, CPU,
memory, GPU count, storage, environment, ports and auto-termination policy; this module
validates those changes against the cluster as it is and says what they are.
"""

from __future__ import annotations

from typing import Any

from gpuyard.core.errors import ValidationFailed
from gpuyard.core.input_rules import check_env_limits, env_bytes
from gpuyard.core.models import PortSpec
from gpuyard.services.clusters.autoterm_policy import merge_policy
from gpuyard.services.clusters.requests import StartCluster
from gpuyard.services.tenancy.secrets import SecretBox, open_env, update_env
from gpuyard.store.schema import Cluster

HOST_PORT = "host_port"


def ports_json(ports: list[PortSpec] | tuple[PortSpec, ...]) -> list[Any]:
    """Port specs as stored before placement gives them host ports."""
    return [p.model_dump() for p in ports]


def ports_of(cluster: Cluster) -> tuple[PortSpec, ...]:
    """The cluster's port specs as declared (without the host ports they got)."""
    return tuple(
        PortSpec.model_validate({k: v for k, v in p.items() if k != HOST_PORT})
        for p in cluster.ports
    )


def with_host_ports(ports: tuple[PortSpec, ...], assigned: dict[tuple[int, str], int]) -> list[Any]:
    """The ports JSON stored on the cluster: each spec plus the host port it got, so
    reads need not join the port claims (which stay the source of truth)."""
    return [{**p.model_dump(), HOST_PORT: assigned[(p.internal_port, p.transport)]} for p in ports]


def check_merged_env(box: SecretBox, old: dict[str, str], new: dict[str, str]) -> None:
    """Refuse an update that takes the cluster's environment past a limit of
    core/input_rules.py (counted on the plain values) and makes it larger than it was.
    Raises ValidationFailed naming ``environment_updates``."""
    plain = open_env(box, new)
    try:
        check_env_limits(plain)
    except ValueError as exc:
        before = open_env(box, old)
        if len(plain) > len(before) or env_bytes(plain) > env_bytes(before):
            raise ValidationFailed(
                "environment_updates", f"the cluster's environment would hold {exc}"
            ) from exc


def merge_ports(current: tuple[PortSpec, ...], updates: list[PortSpec]) -> tuple[PortSpec, ...]:
    """Upsert by (internal port, transport); order of first appearance is kept."""
    merged = {(p.internal_port, p.transport): p for p in current}
    for p in updates:
        merged[(p.internal_port, p.transport)] = p
    return tuple(merged.values())


def start_changes(
    cluster: Cluster, body: StartCluster, box: SecretBox
) -> tuple[dict[str, Any], list[str], list[str]]:
    """The column changes ``body`` asks of ``cluster`` (validated; ValidationFailed
    naming the field otherwise), the human list of what changed, and the reasons the
    rate changes."""
    values: dict[str, Any] = {}
    applied: list[str] = []
    reasons: list[str] = []
    upd = body.update_configuration
    if upd is not None:
        if upd.gpu_count is not None and upd.gpu_count > 0 and not cluster.gpu_type:
            raise ValidationFailed(
                "update_configuration.gpu_count",
                "this cluster has no GPU type; create a GPU cluster",
            )
        if upd.storage_gb is not None and upd.storage_gb < cluster.volume_gb:
            raise ValidationFailed(
                "update_configuration.storage_gb",
                f"storage cannot shrink ({cluster.volume_gb} GB -> {upd.storage_gb} GB)",
                {"current_gb": cluster.volume_gb},
            )
        if upd.storage_gb and cluster.network_volume_id is not None:
            # It has no volume of its own to grow; the network volume grows apart.
            raise ValidationFailed(
                "update_configuration.storage_gb",
                f"this cluster mounts network volume {cluster.network_volume_id}; grow it "
                "with PATCH /v1/networkvolumes/{id}",
                {"network_volume_id": cluster.network_volume_id},
            )
        changes = (
            ("cpu_cores", "cpu_cores", upd.cpu_cores, "CPU change"),
            ("memory_gb", "memory_gb", upd.memory_gb, "Memory upgrade"),
            ("storage_gb", "volume_gb", upd.storage_gb, "Storage expansion"),
            ("docker_image", "image", upd.docker_image, None),
            ("gpu_count", "gpu_count", upd.gpu_count, "GPU count change"),
        )
        for label, column, new, reason in changes:
            old = getattr(cluster, column)
            if new is None or new == old:
                continue
            values[column] = new
            applied.append(f"{label}: {old} -> {new}")
            if reason:
                if label == "memory_gb" and new < old:
                    reason = "Memory downgrade"
                reasons.append(reason)
    if body.environment_updates:
        # Secret values sealed; a mask sent back keeps the stored secret.
        values["env"] = update_env(box, cluster.env, body.environment_updates, body.secret_env)
        # Each request is bounded by its model; this bounds what repeated ones add up to
        # (an environment stored before the limits may keep its size, not grow).
        check_merged_env(box, cluster.env, values["env"])
        applied.append("environment: " + ", ".join(sorted(body.environment_updates)))
    if body.port_mapping_updates is not None:
        ports = merge_ports(ports_of(cluster), body.port_mapping_updates)
        values["ports"] = ports_json(ports)
        applied.append(
            "ports: "
            + ", ".join(f"{p.internal_port}/{p.protocol}" for p in body.port_mapping_updates)
        )
    if body.auto_terminate_updates is not None:
        values["auto_terminate"] = merge_policy(
            cluster.auto_terminate, body.auto_terminate_updates, "auto_terminate_updates."
        )
        applied.append(
            "auto_terminate: " + ", ".join(sorted(body.auto_terminate_updates.model_fields_set))
        )
    return values, applied, reasons
