"""Input types (RunPod's names and fields, plus the seed's ``cluster*`` twins) and
their translation into the cluster use cases' validated bodies.

Every field of RunPod's deploy inputs is accepted. Those that apply take effect (see
:func:`create_bodies`); the others are accepted and ignored, as docs/decisions.md
lists. ``templateId`` names a template of the account (``saveTemplate``): it fills
what the input leaves out (empty strings and zero sizes count as left out);
``networkVolumeId`` mounts that network volume at ``volumeMountPath``.
"""

from __future__ import annotations

import re
from datetime import datetime
from enum import Enum
from typing import Any

import strawberry
from pydantic import ValidationError

from gpuyard.api.graphql.errors import from_pydantic
from gpuyard.core.errors import ValidationFailed
from gpuyard.core.input_rules import MAX_ENV_VARS, parse_id
from gpuyard.core.models import AutoTerminatePolicy, CloudType, PortSpec
from gpuyard.services.clusters.requests import CreateCluster


@strawberry.enum(name="CloudTypeEnum")
class CloudTypeEnum(Enum):
    ALL = "ALL"
    SECURE = "SECURE"
    COMMUNITY = "COMMUNITY"


@strawberry.enum(name="ComputeType")
class ComputeType(Enum):
    CPU = "CPU"
    GPU = "GPU"


@strawberry.input(name="EnvironmentVariableInput")
class EnvironmentVariableInput:
    key: str
    value: str
    secret: bool | None = strawberry.field(
        default=None,
        description="Store the value encrypted and show it masked (names with PASSWORD, "
        "TOKEN, SECRET, KEY, ... are secret without it)",
    )


@strawberry.input(name="DeployInputFields", description="Fields every deploy input has.")
class DeployFields:
    cloud_type: CloudTypeEnum | None = None
    gpu_type_id: str | None = None
    gpu_type_id_list: list[str | None] | None = None
    gpu_count: int | None = None
    volume_in_gb: int | None = None
    container_disk_in_gb: int | None = None
    min_vcpu_count: int | None = None
    min_memory_in_gb: int | None = None
    min_disk: int | None = None
    min_download: int | None = None
    min_upload: int | None = None
    name: str | None = None
    image_name: str | None = None
    docker_args: str | None = None
    ports: str | None = None
    port: int | None = None
    volume_mount_path: str | None = None
    env: list[EnvironmentVariableInput | None] | None = None
    template_id: str | None = None
    network_volume_id: str | None = None
    start_ssh: bool | None = None
    start_jupyter: bool | None = None
    support_public_ip: bool | None = None
    data_center_id: str | None = None
    country_code: str | None = None
    allowed_cuda_versions: list[str | None] | None = None
    cuda_version: str | None = None
    min_cuda_version: str | None = None
    stop_after: str | None = None
    terminate_after: str | None = None
    volume_key: str | None = None
    container_registry_auth_id: str | None = None
    instance_id: str | None = None
    compute_type: ComputeType | None = None
    deploy_cost: float | None = None
    ai_api_id: str | None = None
    global_network: bool | None = None


@strawberry.input(name="PodFindAndDeployOnDemandInput")
class PodFindAndDeployOnDemandInput(DeployFields):
    pass


@strawberry.input(name="ClusterFindAndDeployOnDemandInput")
class ClusterFindAndDeployOnDemandInput(DeployFields):
    pass


@strawberry.input(name="deployCpuPodInput")
class DeployCpuPodInput(DeployFields):
    pass


@strawberry.input(name="PodRentInterruptableInput")
class PodRentInterruptableInput(DeployFields):
    bid_per_gpu: float


@strawberry.input(name="ClusterRentInterruptableInput")
class ClusterRentInterruptableInput(DeployFields):
    bid_per_gpu: float


@strawberry.input(name="PodResumeInput")
class PodResumeInput:
    pod_id: str
    gpu_count: int | None = None
    sync_machine: bool | None = None
    compute_type: ComputeType | None = None


@strawberry.input(name="ClusterResumeInput")
class ClusterResumeInput:
    cluster_id: str
    gpu_count: int | None = None


@strawberry.input(name="PodBidResumeInput")
class PodBidResumeInput:
    pod_id: str
    bid_per_gpu: float
    gpu_count: int | None = None


@strawberry.input(name="ClusterBidResumeInput")
class ClusterBidResumeInput:
    cluster_id: str
    bid_per_gpu: float
    gpu_count: int | None = None


@strawberry.input(name="PodStopInput")
class PodStopInput:
    pod_id: str
    increment_version: bool | None = None


@strawberry.input(name="ClusterStopInput")
class ClusterStopInput:
    cluster_id: str


@strawberry.input(name="PodTerminateInput")
class PodTerminateInput:
    pod_id: str


@strawberry.input(name="ClusterTerminateInput")
class ClusterTerminateInput:
    cluster_id: str


@strawberry.input(name="PodFilter")
class PodFilter:
    pod_id: str


@strawberry.input(name="ClusterFilter")
class ClusterFilter:
    cluster_id: str


@strawberry.input(name="GpuTypeFilter")
class GpuTypeFilter:
    id: str | None = None
    ids: list[str | None] | None = None


@strawberry.input(name="GpuLowestPriceInput")
class GpuLowestPriceInput:
    gpu_count: int | None = None
    secure_cloud: bool | None = None
    min_disk: int | None = None
    min_memory_in_gb: int | None = None
    min_vcpu_count: int | None = None
    min_download: int | None = None
    min_upload: int | None = None
    support_public_ip: bool | None = None
    country_code: str | None = None
    data_center_id: str | None = None
    cuda_version: str | None = None
    allowed_cuda_versions: list[str | None] | None = None
    global_network: bool | None = None
    # Accepted as RunPod's clients send them; no host has a known certification.
    compliance: list[str | None] | None = None
    include_ai_api: bool | None = None


# CreateCluster's fields by the GraphQL input fields that set them (for error paths).
GRAPHQL_NAMES = {
    "name": "name",
    "gpu_type": "gpuTypeId",
    "gpu_count": "gpuCount",
    "cpu_cores": "minVcpuCount",
    "memory_gb": "minMemoryInGb",
    "container_disk_gb": "containerDiskInGb",
    "volume_gb": "volumeInGb",
    "volume_mount_path": "volumeMountPath",
    "docker_image": "imageName",
    "docker_args": "dockerArgs",
    "env": "env",
    "ports": "ports",
    "cloud_type": "cloudType",
    "auto_terminate": "stopAfter",
    "bid_per_gpu": "bidPerGpu",
    "location": "dataCenterId",
    "network_volume_id": "networkVolumeId",
    "template_id": "templateId",
    "registry_auth_id": "containerRegistryAuthId",
    "min_cuda_version": "minCudaVersion",
    "allowed_cuda_versions": "allowedCudaVersions",
}

# RunPod's public templates (``runpod-ubuntu``, which runpod-python names for every CPU
# pod, ``runpod-torch``, ...): never one of ours (our ids have no hyphen), so with an
# imageName they ask for nothing more and are ignored.
RUNPOD_TEMPLATE_PREFIX = "runpod-"

_PORT = re.compile(r"^\s*(\d{1,5})\s*(?:/\s*(http|tcp|udp)\s*)?$", re.IGNORECASE)
# RunPod CPU instance ids: cpu3c-2-4 = flavour, vCPUs, memory GB.
_INSTANCE = re.compile(r"^cpu\w*-(\d+)-(\d+)$")


def parse_ports(spec: str | None, extra_port: int | None = None) -> list[PortSpec]:
    """``"8888/http,22/tcp"`` as port specs (host ports assigned). A port without a
    protocol is ``http``, as RunPod's console writes it. Raises ValidationFailed."""
    out: dict[tuple[int, str], PortSpec] = {}
    items = [p for p in (spec or "").split(",") if p.strip()]
    if extra_port is not None:
        items.append(f"{extra_port}/http")
    for item in items:
        m = _PORT.match(item)
        if m is None:
            raise ValidationFailed(
                "input.ports", f"{item.strip()!r} is not PORT/PROTOCOL (http, tcp or udp)"
            )
        port = int(m.group(1))
        if not 1 <= port <= 65535:
            raise ValidationFailed("input.ports", f"port {port} is out of range 1-65535")
        proto = (m.group(2) or "http").lower()
        spec_ = PortSpec(internal_port=port, protocol=proto)
        out.setdefault((port, spec_.transport), spec_)
    return list(out.values())


def _deadline(value: str, field: str, now: datetime, action: str) -> AutoTerminatePolicy:
    try:
        at = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as exc:
        raise ValidationFailed(field, "must be an ISO 8601 date-time") from exc
    if at.tzinfo is None:
        at = at.replace(tzinfo=now.tzinfo)
    hours = (at - now).total_seconds() / 3600
    if hours <= 0:
        raise ValidationFailed(field, "must be in the future")
    try:
        return AutoTerminatePolicy(enabled=True, max_runtime_hours=hours, action=action)
    except ValidationError as exc:
        raise from_pydantic(exc, {}, field) from exc


def create_bodies(
    data: DeployFields, now: datetime, *, cpu_only: bool, bid_per_gpu: float | None = None
) -> list[CreateCluster]:
    """One validated body per GPU type to try, in order (``gpuTypeId`` first, then
    ``gpuTypeIdList``); the caller deploys the first that finds capacity.

    Applied: name, imageName, dockerArgs, env, ports (and ``port``), volumeMountPath,
    volumeInGb, containerDiskInGb, minVcpuCount / minMemoryInGb (vCPUs and memory; a
    CPU ``instanceId`` like ``cpu3c-2-4`` gives them when absent), gpuCount,
    cloudType, stopAfter / terminateAfter (auto-terminate after that time), bidPerGpu
    (interruptible at that bid), networkVolumeId (mounted at volumeMountPath instead of
    a volume of its own; the cluster goes to the network volume's host),
    containerRegistryAuthId (the image is pulled with those registry credentials),
    minCudaVersion / allowedCudaVersions (only hosts whose CUDA driver version is at
    least that / one of those; "" and [] as absent).
    Raises ValidationFailed.
    """
    template_id = data.template_id or None
    if template_id and template_id.startswith(RUNPOD_TEMPLATE_PREFIX) and data.image_name:
        template_id = None
    if not data.image_name and template_id is None:
        raise ValidationFailed("input.imageName", "required (or a templateId)")
    vcpus, memory = data.min_vcpu_count, data.min_memory_in_gb
    if data.instance_id and (m := _INSTANCE.match(data.instance_id)):
        vcpus = vcpus or int(m.group(1))
        memory = memory or int(m.group(2))
    if data.env is not None and len(data.env) > MAX_ENV_VARS:
        # Counted as sent: duplicates would otherwise hide in the dict built below.
        raise ValidationFailed(
            "input.env", f"{len(data.env)} environment variables; at most {MAX_ENV_VARS}"
        )
    auto: AutoTerminatePolicy | None = None
    if data.stop_after:
        auto = _deadline(data.stop_after, "input.stopAfter", now, "stop")
    elif data.terminate_after:
        auto = _deadline(data.terminate_after, "input.terminateAfter", now, "terminate")
    base: dict[str, Any] = {
        "name": data.name or "",
        "env": {
            e.key: {"value": e.value, "secret": True} if e.secret else e.value
            for e in data.env or []
            if e is not None
        },
        # "" as absent, like dataCenterId.
        "network_volume_id": data.network_volume_id or None,
        "cloud_type": CloudType(data.cloud_type.value) if data.cloud_type else CloudType.ALL,
        "auto_terminate": auto,
        # RunPod's CUDA filters; "" and [] as absent.
        "min_cuda_version": data.min_cuda_version or None,
        "allowed_cuda_versions": [v for v in data.allowed_cuda_versions or [] if v is not None]
        or None,
    }
    # Only what was given (a template fills the rest; without one, the defaults are
    # the create body's own).
    ports = parse_ports(data.ports, data.port)
    given = {
        "docker_image": data.image_name,
        "docker_args": data.docker_args,
        "ports": ports,
        "volume_mount_path": data.volume_mount_path,
        "volume_gb": data.volume_in_gb,
        "template_id": template_id,
    }
    base.update({k: v for k, v in given.items() if v})
    # The account's registry credentials (saveRegistryAuth's id); "" as absent, so a
    # template's credentials apply when none are given.
    auth_id = parse_id("input.containerRegistryAuthId", data.container_registry_auth_id)
    if auth_id is not None:
        base["registry_auth_id"] = auth_id
    if vcpus:
        base["cpu_cores"] = vcpus
    if memory:
        base["memory_gb"] = memory
    if data.container_disk_in_gb:
        base["container_disk_gb"] = data.container_disk_in_gb
    if bid_per_gpu is not None:
        base.update(interruptible=True, bid_per_gpu=bid_per_gpu)
    gpu_count = 0 if cpu_only else (data.gpu_count if data.gpu_count is not None else 1)
    candidates: list[str | None] = []
    if gpu_count > 0:
        for name in [data.gpu_type_id, *(data.gpu_type_id_list or [])]:
            if name and name not in candidates:
                candidates.append(name)
        if not candidates:
            raise ValidationFailed(
                "input.gpuTypeId", "a GPU type is required (gpuTypeId or gpuTypeIdList)"
            )
    else:
        candidates.append(None)
    try:
        return [CreateCluster(**base, gpu_type=name, gpu_count=gpu_count) for name in candidates]
    except ValidationError as exc:
        raise from_pydantic(exc, GRAPHQL_NAMES) from exc


@strawberry.input(name="SaveRegistryAuthInput")
class SaveRegistryAuthInput:
    name: str = strawberry.field(description="Unique in the account")
    username: str
    password: str = strawberry.field(description="Sealed at rest; never answered")


@strawberry.input(name="UpdateRegistryAuthInput")
class UpdateRegistryAuthInput:
    id: str
    username: str
    password: str = strawberry.field(description="Sealed at rest; never answered")


@strawberry.input(name="UpdateUserSettingsInput")
class UpdateUserSettingsInput:
    pub_key: str | None = strawberry.field(
        default=None,
        description="Every SSH public key of the account, one per line (RunPod): keys not "
        "listed are removed, new ones added (named by their comment). Null: unchanged.",
    )
