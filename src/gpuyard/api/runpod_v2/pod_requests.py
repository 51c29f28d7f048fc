"""From RunPod v2's pod bodies to gpuyard's cluster inputs, and gpuyard's field
names back to the pod's (so a 400 names what the client sent).

Pure: :func:`create_inputs` maps a ``CreatePodRequest`` onto the keyword arguments of
services/clusters/requests.py ``CreateCluster`` and the locations to try in order;
:func:`create_cluster_input` validates them as the use case's input.
"""

from __future__ import annotations

import re
import secrets
import shlex
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from gpuyard.api.runpod_v2.pod_schemas import Command, CreatePodRequest
from gpuyard.core.errors import ValidationFailed
from gpuyard.core.models import PortSpec
from gpuyard.services.clusters.requests import CreateCluster

# gpuyard's input field -> the pod's (a prefix up to "." or "[").
POD_FIELDS: dict[str, str] = {
    "name": "name",
    "docker_image": "image",
    "docker_args": "args",
    "env": "env",
    "ports": "ports",
    "port_mapping_updates": "ports",
    "container_disk_gb": "disk",
    "volume_gb": "mounts.persistent.size",
    "storage_gb": "mounts.persistent.size",
    "volume_mount_path": "mounts",
    "network_volume_id": "mounts.network",
    "gpu_type": "gpu.id",
    "gpu_count": "gpu.count",
    "cpu_cores": "cpu.vcpuCount",
    "memory_gb": "cpu",
    "cloud_type": "cloud",
    "interruptible": "interruptible",
    "bid_per_gpu": "bidPerGpu",
    "template_id": "templateId",
    "registry_auth_id": "registry",
    "location": "dataCenterIds",
    "docker_entrypoint": "entrypoint",
    "min_cuda_version": "gpu.minCudaVersion",
    "allowed_cuda_versions": "gpu.allowedCudaVersions",
    "environment_updates": "env",
    "update_configuration": "image",
}
_ROOT = re.compile(r"[^.\[]+")
# Fields whose inner part (an index, a variable) the pod's field keeps.
_KEEP_REST = frozenset({"ports", "port_mapping_updates", "env", "environment_updates"})
# GB of memory per vCPU of RunPod's CPU flavors (the flavor's last letter).
_CPU_MEMORY_PER_VCPU = {"c": 2, "g": 4, "m": 8}
_DEFAULT_MEMORY_PER_VCPU = 4


def pod_field(field: str) -> str:
    """The pod's name for gpuyard's input ``field`` (``docker_image`` -> ``image``,
    ``ports[2]`` -> ``ports[2]``, ``update_configuration.storage_gb`` ->
    ``mounts.persistent.size``)."""
    root = _ROOT.match(field)
    head = root.group(0) if root else field
    rest = field[len(head) :]
    if head == "update_configuration" and rest.startswith("."):
        inner = _ROOT.match(rest[1:])
        return POD_FIELDS.get(inner.group(0), "image") if inner else "image"
    mapped = POD_FIELDS.get(head, head)
    return mapped + rest if head in _KEEP_REST else mapped


def renamed(exc: ValidationFailed) -> ValidationFailed:
    """``exc`` naming the pod's field instead of gpuyard's."""
    field = pod_field(exc.field)
    message = exc.message.split(": ", 1)[1] if ": " in exc.message else exc.message
    details = {k: v for k, v in exc.details.items() if k != "field"}
    return ValidationFailed(field, message, details)


def cpu_memory_gb(flavor: str, vcpus: int) -> int:
    """The memory a CPU pod of ``flavor`` with ``vcpus`` gets (RunPod derives it
    from the flavor)."""
    per = _CPU_MEMORY_PER_VCPU.get(flavor[-1:].lower(), _DEFAULT_MEMORY_PER_VCPU)
    return vcpus * per


def command_text(value: Command, field: str) -> str:
    """``cmd``/``args`` as gpuyard's ``docker_args`` (one string, split like a shell at
    the start): a list is joined with shell quoting, a string kept as it is."""
    if isinstance(value, str):
        try:
            shlex.split(value)
        except ValueError as exc:
            raise ValidationFailed(field, f"cannot be split like a shell command: {exc}") from None
        return value
    return shlex.join(value)


def command_list(value: Command, field: str) -> list[str]:
    if isinstance(value, list):
        return list(value)
    try:
        return shlex.split(value)
    except ValueError as exc:
        raise ValidationFailed(field, f"cannot be split like a shell command: {exc}") from None


def port_specs(ports: list[str], field: str = "ports") -> list[dict[str, Any]]:
    """``["22/tcp", "8888/http"]`` as gpuyard's port specs (gpuyard picks host ports)."""
    out: list[dict[str, Any]] = []
    seen: set[tuple[int, str]] = set()
    for i, text in enumerate(ports):
        number, _, protocol = text.partition("/")
        port = int(number) if number.isdigit() else 0
        if not 1 <= port <= 65535 or protocol not in ("tcp", "udp", "http"):
            raise ValidationFailed(f"{field}[{i}]", f"{text!r} is not PORT/tcp, /udp or /http")
        key = (port, "udp" if protocol == "udp" else "tcp")
        if key in seen:
            raise ValidationFailed(f"{field}[{i}]", f"port {port} is listed twice")
        seen.add(key)
        out.append({"internal_port": port, "protocol": protocol})
    return out


def port_texts(specs: list[PortSpec] | tuple[PortSpec, ...]) -> list[str]:
    return [f"{p.internal_port}/{p.protocol}" for p in specs]


def registry_id(value: str | None) -> int | None:
    if value is None or value == "":
        return None
    if not value.isdigit() or not 1 <= int(value) <= 2**31 - 1:
        raise ValidationFailed("registry", f"unknown registry credential {value!r}")
    return int(value)


@dataclass(frozen=True)
class CreateInputs:
    """What a create asks of gpuyard: ``CreateCluster``'s fields and the locations to
    try in order (empty: anywhere)."""

    values: dict[str, Any]
    locations: tuple[str, ...]


def _mounts(body: CreatePodRequest, values: dict[str, Any]) -> None:
    mounts = body.mounts
    if mounts is None:
        return
    network = mounts.network or []
    if mounts.persistent is not None and network:
        raise ValidationFailed(
            "mounts", "gpuyard mounts one volume per pod: persistent or network, not both"
        )
    if mounts.persistent is not None:
        if body.cpu is not None:
            raise ValidationFailed("mounts.persistent", "CPU pods take network volumes only")
        values["volume_gb"] = mounts.persistent.size
        values["volume_mount_path"] = mounts.persistent.path
    if network:
        values["network_volume_id"] = network[0].volumeId
        values["volume_mount_path"] = network[0].path


def _compute(body: CreatePodRequest, values: dict[str, Any]) -> None:
    if (body.gpu is None) == (body.cpu is None):
        raise ValidationFailed("gpu", "give exactly one of gpu (a GPU pod) or cpu (a CPU pod)")
    if body.gpu is not None:
        values["gpu_type"] = body.gpu.id
        values["gpu_count"] = body.gpu.count
    elif body.cpu is not None:
        values["gpu_count"] = 0
        values["cpu_cores"] = body.cpu.vcpuCount
        values["memory_gb"] = cpu_memory_gb(body.cpu.id, body.cpu.vcpuCount)


def _cuda(body: CreatePodRequest, values: dict[str, Any]) -> None:
    """The host's CUDA driver version rules: at least ``minCudaVersion``, one of
    ``allowedCudaVersions`` (placement checks both, services/capacity)."""
    gpu = body.gpu
    if gpu is None:
        return
    if gpu.minCudaVersion is not None:
        values["min_cuda_version"] = gpu.minCudaVersion
    if gpu.allowedCudaVersions:
        values["allowed_cuda_versions"] = list(gpu.allowedCudaVersions)


def create_inputs(body: CreatePodRequest) -> CreateInputs:
    """The cluster a ``CreatePodRequest`` asks for. Raises ValidationFailed naming the
    pod's field for a rule across fields (gpu or cpu, one volume, args or cmd, a bid
    and a spot flag that disagree, global networking)."""
    if body.image is None and body.templateId is None:
        raise ValidationFailed("image", "is required (or a templateId)")
    if body.globalNetworking:
        raise ValidationFailed("globalNetworking", "gpuyard has no global networking")
    values: dict[str, Any] = {"name": body.name, "cloud_type": body.cloud}
    _compute(body, values)
    _mounts(body, values)
    if body.image is not None:
        values["docker_image"] = body.image
    if body.args is not None and body.cmd is not None:
        raise ValidationFailed("cmd", "give args or cmd, not both")
    if body.cmd is not None:
        values["docker_args"] = command_text(body.cmd, "cmd")
    elif body.args is not None:
        values["docker_args"] = command_text(body.args, "args")
    env = dict(body.env or {})
    if body.startJupyter and "JUPYTER_PASSWORD" not in env:
        # RunPod's convention; a name with PASSWORD is stored sealed and shown masked.
        env["JUPYTER_PASSWORD"] = secrets.token_urlsafe(18)
    if env:
        values["env"] = env
    if body.ports is not None:
        values["ports"] = port_specs(body.ports)
    if body.disk is not None:
        values["container_disk_gb"] = body.disk
    registry = registry_id(body.registry)
    if registry is not None:
        values["registry_auth_id"] = registry
    if body.templateId is not None:
        values["template_id"] = body.templateId
    if body.bid is not None and body.bidPerGpu is not None and body.bid != body.bidPerGpu:
        raise ValidationFailed("bidPerGpu", "bid and bidPerGpu name the same bid; give one")
    bid = body.bidPerGpu if body.bidPerGpu is not None else body.bid
    if bid is not None:
        values["bid_per_gpu"] = bid
    if body.interruptible:
        values["interruptible"] = True
    if body.entrypoint:
        values["docker_entrypoint"] = command_list(body.entrypoint, "entrypoint")
    _cuda(body, values)
    # startSsh needs nothing: every start hands the account's SSH keys to the container
    # as PUBLIC_KEY (and the gateway takes them).
    locations = tuple(dict.fromkeys(loc for loc in body.dataCenterIds or [] if loc))
    return CreateInputs(values, locations)


def create_cluster_input(inputs: CreateInputs) -> CreateCluster:
    """``CreateCluster`` of ``inputs``; its refusals name the pod's fields."""
    try:
        return CreateCluster.model_validate(inputs.values)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first.get("loc", ())) or "body"
        raise renamed(ValidationFailed(field, str(first.get("msg", "invalid")))) from None
