"""Response schemas for OpenAPI.

Handlers build plain dicts (api/rest/schemas/cluster_json.py) for speed; these models
document the exact shape, and the API tests validate real responses against them with unknown fields
forbidden, so the documentation cannot drift from what the server sends.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gpuyard.core.text import refuse_nul


class StrictOut(BaseModel):
    """An answer's model: unknown fields are forbidden, so the documentation cannot
    drift from what is sent (the API tests validate real answers against it)."""

    model_config = ConfigDict(extra="forbid")


class StrictIn(BaseModel):
    """A request body's model: unknown fields are refused (400 naming the field), and
    so is a NUL anywhere in the body."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _no_nul(cls, data: Any) -> Any:
        return refuse_nul(data)


class Meta(StrictOut):
    request_id: str


class StartMeta(Meta):
    wait_for_ready: bool
    wait_timed_out: bool | None = None


class Port(StrictOut):
    internal_port: int
    external_port: int
    protocol: Literal["http", "tcp", "udp"]
    description: str
    visibility: Literal["private", "public"]


class NetworkPort(Port):
    address: str | None
    proxy_url: str | None


class SshConnection(StrictOut):
    host: str | None
    port: int | None
    username: str | None
    connection_string: str | None
    # ``ssh CLUSTER@HOST -p 2222`` through the SSH gateway (null when it is off).
    gateway: str | None
    # ``ssh root@HOST -p N`` straight to the container's sshd (22/tcp published).
    direct: str | None


class Network(StrictOut):
    ip: str | None
    ports: list[NetworkPort]
    proxy_url: str | None
    ssh_connection: SshConnection


class RateBreakdown(StrictOut):
    gpu: float
    compute: float
    container_disk: float
    volume: float


class BillingBreakdown(RateBreakdown):
    """A bill's meters: a cluster's four, and storage that outlives clusters."""

    snapshot: float
    network_volume: float


class Accrued(StrictOut):
    """USD billed so far (per-second usage intervals; rounded down to micro-USD)."""

    current_run: float
    lifetime: float


class Cost(StrictOut):
    hourly_rate: float
    currency: Literal["USD"]
    breakdown: RateBreakdown
    accrued_usd: Accrued
    # When the current run began (its latest start); ``accrued_usd.current_run`` counts
    # from here.
    since: str | None


class StartCost(Cost):
    new_hourly_rate: float
    previous_hourly_rate: float
    rate_change_reason: str | None


class HostRef(StrictOut):
    id: int
    name: str | None
    location: str | None
    gpu_source: str | None
    status: str | None
    reachability: str | None


class MovingVolume(StrictOut):
    from_host_id: int
    to_host_id: int
    bytes_copied: int
    started_at: str | None


class RestoringSnapshot(StrictOut):
    snapshot_id: str
    bytes_restored: int
    total_bytes: int
    percentage: int
    started_at: str | None
    # The snapshot taken first (snapshot_before_changes) that the restore waits for.
    waiting_for_snapshot: str | None = None


class StartupProgress(StrictOut):
    phase: str
    percentage: int
    current_step: str
    steps_completed: int
    total_steps: int
    moving_volume: MovingVolume | None = None
    restoring_snapshot: RestoringSnapshot | None = None


class ClusterVolume(StrictOut):
    """What is mounted at the mount path: the cluster's own volume or a network volume."""

    size_gb: int
    mount_path: str
    used_bytes: int | None = Field(description="Bytes used when last measured (null: not yet)")
    measured_at: str | None
    network_volume_id: str | None = Field(
        description="The network volume mounted instead of a volume of its own"
    )


class LastExit(StrictOut):
    exit_code: int | None
    seen_at: str | None
    restarted_at: str | None
    next_restart_at: str | None


class Cluster(StrictOut):
    id: str
    name: str
    project_id: int
    status: str
    desired_status: str
    actions: list[str]
    last_status_change: str
    error_message: str | None
    restarts: int = Field(description="How often the container was brought back after dying")
    last_exit: LastExit | None
    docker_image: str
    docker_args: str
    docker_entrypoint: list[str] | None = Field(
        description="The ENTRYPOINT in place of the image's (null: the image's own; []: none)"
    )
    min_cuda_version: str | None = Field(
        description="Placed only on hosts whose CUDA driver version is at least this"
    )
    allowed_cuda_versions: list[str] | None = Field(
        description="Placed only on hosts whose CUDA driver version is one of these"
    )
    template_id: str | None = Field(description="The template it was created from (null: none)")
    registry_auth_id: int | None = Field(
        description="The registry credentials its image is pulled with (null: none)"
    )
    serverless_endpoint_id: str | None = Field(
        description="The serverless endpoint it is a worker of (null: a cluster of its own); "
        "a worker is started and stopped by its endpoint, not by the user"
    )
    gpu_type: str | None
    gpu_display_name: str | None
    gpu_count: int
    gpu_indices: list[int]
    cpu_cores: int
    memory_gb: int
    container_disk_gb: int
    volume_gb: int
    storage_gb: int
    volume_mount_path: str
    volume: ClusterVolume | None
    cloud_type: str
    interruptible: bool
    bid_per_gpu: float | None
    env: dict[str, str]
    ports: list[Port]
    auto_terminate: dict[str, Any]
    host: HostRef | None
    host_status: str | None
    network: Network
    cost: Cost
    created_at: str | None
    updated_at: str | None
    start_initiated_at: str | None
    started_at: str | None
    stopped_at: str | None
    terminated_at: str | None
    startup_progress: StartupProgress | None = None
    estimated_ready_at: str | None = None


class SnapshotRef(StrictOut):
    id: str
    name: str
    status: str


class StartedCluster(Cluster):
    cost: StartCost
    configuration_updates_applied: list[str]
    # The snapshot taken before the changes (``snapshot_before_changes``); else null.
    snapshot_before_changes: SnapshotRef | None = None


class Pagination(StrictOut):
    """Where a page lies. ``next_cursor`` (null on the last page) is the ``cursor``
    query parameter of the next page: pass it back with the same filters."""

    page: int
    per_page: int
    total: int
    pages: int
    next_cursor: str | None


class ClusterList(StrictOut):
    clusters: list[Cluster]
    pagination: Pagination


class EventOut(StrictOut):
    id: int
    at: str | None
    type: str
    from_status: str | None
    to_status: str | None
    message: str


class EventList(StrictOut):
    events: list[EventOut]
    pagination: Pagination


class ClusterEnvelope(StrictOut):
    success: Literal[True]
    data: Cluster
    meta: Meta


class StartEnvelope(StrictOut):
    success: Literal[True]
    data: StartedCluster
    meta: StartMeta


class ClusterListEnvelope(StrictOut):
    success: Literal[True]
    data: ClusterList
    meta: Meta


class EventListEnvelope(StrictOut):
    success: Literal[True]
    data: EventList
    meta: Meta


class ClusterV2(StrictOut):
    """The flat object of seed 000's v2 endpoints (camelCase field names are the seed's)."""

    id: str
    name: str
    status: str
    gpuType: str | None
    gpuCount: int
    containerDiskSize: int
    volumeSize: int
    createdAt: str | None


class BillingItem(StrictOut):
    key: str  # cluster id, GPU type ("none" for GPU-less usage) or UTC day (YYYY-MM-DD)
    name: str | None  # the cluster's name (group_by=cluster)
    total_usd: float
    gpu_hours: float
    breakdown: BillingBreakdown


class Billing(StrictOut):
    from_: str = Field(alias="from")
    to: str
    group_by: Literal["cluster", "gpu_type", "day"]
    project_id: int | None
    currency: Literal["USD"]
    total_usd: float
    breakdown: BillingBreakdown
    items: list[BillingItem]
    total_micro_usd: int


class BillingEnvelope(StrictOut):
    success: Literal[True]
    data: Billing
    meta: Meta


def documented(model: type[BaseModel], status: int = 200) -> dict[int | str, dict[str, Any]]:
    return {status: {"model": model}}
