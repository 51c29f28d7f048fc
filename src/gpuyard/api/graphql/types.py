# Strawberry's field decorators are typed as returning Any; the resolvers are typed.
# mypy: disable-error-code="untyped-decorator"
"""Object types of the schema: the cluster (RunPod's ``Pod``), its machine and
runtime, GPU types with their lowest price, and the caller (``User``).

Field values are computed once when an object is built from the domain
(:func:`pod_from`, :func:`gpu_type_from`) so plain fields resolve by attribute; only
what costs a read of its own (container stats, free GPUs, GPU UUIDs, prices) is a
resolver, batched through the request's :class:`GqlContext`: container stats through
its stats loader (one round of concurrent engine calls for a whole list, shared with
other requests for a few seconds), free GPUs and prices through one market read per
request, GPU UUIDs through the app's cache.
"""

from __future__ import annotations

from collections.abc import Awaitable, Iterable
from datetime import datetime
from enum import Enum

import strawberry
from strawberry.types.nodes import Selection

from gpuyard.api.graphql.access import require
from gpuyard.api.graphql.context import GqlContext
from gpuyard.api.graphql.inputs import GpuLowestPriceInput
from gpuyard.api.graphql.serverless import Endpoint, ServerlessDiscount, my_endpoints
from gpuyard.api.graphql.templates import PodTemplate, pod_templates
from gpuyard.api.rest.schemas.cluster_json import iso, proxy_url
from gpuyard.core.models import CloudType, GpuTypeInfo, HostCapacity
from gpuyard.core.roles import Permission
from gpuyard.core.secret_env import masked_env
from gpuyard.core.states import ClusterStatus, allowed_actions
from gpuyard.runtimes.base import ContainerStats
from gpuyard.services.billing import spot
from gpuyard.services.clusters.views import ClusterDetails
from gpuyard.services.fleet.runtime_stats import StatsKey
from gpuyard.services.serverless.endpoint_views import workers_spend_per_hr
from gpuyard.services.volumes.network_volumes import list_network_volumes

Info = strawberry.Info[GqlContext, None]


@strawberry.enum(name="PodStatus", description="RunPod's desired status of a pod.")
class PodStatus(Enum):
    CREATED = "CREATED"
    RUNNING = "RUNNING"
    RESTARTING = "RESTARTING"
    EXITED = "EXITED"
    PAUSED = "PAUSED"
    DEAD = "DEAD"
    TERMINATED = "TERMINATED"


@strawberry.enum(name="PodType", description="RESERVED (on demand) or INTERRUPTABLE (spot).")
class PodType(Enum):
    INTERRUPTABLE = "INTERRUPTABLE"
    RESERVED = "RESERVED"


DESIRED_STATUS: dict[str, PodStatus] = {
    ClusterStatus.PENDING: PodStatus.RUNNING,
    ClusterStatus.STARTING: PodStatus.RUNNING,
    ClusterStatus.RUNNING: PodStatus.RUNNING,
    ClusterStatus.STOPPING: PodStatus.EXITED,
    ClusterStatus.STOPPED: PodStatus.EXITED,
    ClusterStatus.ERROR: PodStatus.EXITED,
    ClusterStatus.TERMINATING: PodStatus.TERMINATED,
    ClusterStatus.TERMINATED: PodStatus.TERMINATED,
}


@strawberry.type(name="PodRuntimePorts")
class RuntimePort:
    ip: str | None
    is_ip_public: bool
    private_port: int
    public_port: int | None
    type: str
    proxy_url: str | None = strawberry.field(
        default=None, description="The port's address on the HTTP proxy (http ports)"
    )


@strawberry.type(name="PodRuntimeGpus")
class RuntimeGpu:
    id: str
    gpu_util_percent: float | None
    memory_util_percent: float | None


@strawberry.type(name="PodRuntimeContainer")
class RuntimeContainer:
    cpu_percent: float
    memory_percent: float


@strawberry.type(name="PodRuntime", description="Null unless the cluster is running.")
class PodRuntime:
    uptime_in_seconds: int
    ports: list[RuntimePort]
    _cluster_id: strawberry.Private[str]
    _host_id: strawberry.Private[int | None]
    _gpu_indices: strawberry.Private[tuple[int, ...]]
    _declared: strawberry.Private[bool]

    @strawberry.field(
        description="The cluster's GPUs. Utilisation is 0 for declared GPUs (nothing to "
        "measure) and null where it is not measured."
    )
    def gpus(self, info: Info) -> list[RuntimeGpu]:
        util = 0.0 if self._declared else None
        out = []
        for index in self._gpu_indices:
            uuid = info.context.gpu_uuid(self._host_id, index) if self._host_id else None
            out.append(
                RuntimeGpu(
                    id=uuid or f"GPU-{self._host_id}-{index}",
                    gpu_util_percent=util,
                    memory_util_percent=util,
                )
            )
        return out

    @strawberry.field(
        graphql_type=RuntimeContainer | None,
        description="CPU% (100 = one core) and memory% from the engine (at most a few "
        "seconds old); null when the engine cannot say.",
    )
    def container(self, info: Info) -> RuntimeContainer | Awaitable[RuntimeContainer | None] | None:
        # A list fetched every listed container's stats at once (User.clusters); this
        # resolver stays synchronous then, since an awaitable per listed pod costs
        # more than the field. A cluster fetched alone asks the stats loader.
        key = self._stats_key
        prefetched = info.context.prefetched_stats
        if key in prefetched:
            return _container_of(prefetched[key])
        return self._load_container(info, key)

    @property
    def _stats_key(self) -> StatsKey:
        return StatsKey(self._cluster_id, self._host_id)

    async def _load_container(self, info: Info, key: StatsKey) -> RuntimeContainer | None:
        return _container_of(await info.context.loaders.stats.load(key))


def _container_of(stats: ContainerStats | None) -> RuntimeContainer | None:
    if stats is None:
        return None
    return RuntimeContainer(
        cpu_percent=round(stats.cpu_percent, 2), memory_percent=round(stats.memory_percent, 2)
    )


@strawberry.type(description="The host a cluster is placed on.")
class Machine:
    id: str
    name: str | None
    pod_host_id: str
    cluster_host_id: str
    gpu_type_id: str | None
    gpu_display_name: str | None
    location: str | None
    gpu_source: str | None = strawberry.field(
        description="nvml (discovered) or declared (configured inventory)"
    )
    maintenance_start: str | None = None
    maintenance_end: str | None = None
    maintenance_note: str | None = None
    _host_id: strawberry.Private[int] = 0

    @strawberry.field(description="Free GPUs of this cluster's type on the machine now.")
    def gpu_available(self, info: Info) -> int:
        cap = info.context.capacities().get(self._host_id)
        if cap is None or self.gpu_type_id is None:
            return 0
        return sum(
            1
            for g in cap.gpus
            if g.gpu_type == self.gpu_type_id and g.index not in cap.used_gpu_indices
        )


@strawberry.type(name="ContainerRegistryAuth")
class ContainerRegistryAuth:
    """Private registry credentials: RunPod answers their id and name only."""

    id: str
    name: str


@strawberry.type(name="Pod", description="A cluster (RunPod's pod), as the caller may see it.")
class Pod:
    id: str
    name: str
    image_name: str
    docker_args: str
    docker_entrypoint: list[str] | None = strawberry.field(
        description="The ENTRYPOINT in place of the image's (null: the image's own; []: none)"
    )
    min_cuda_version: str | None = strawberry.field(
        description="Placed only on hosts whose CUDA driver version is at least this"
    )
    docker_id: str | None
    env: list[str] = strawberry.field(
        description='"KEY=value" strings, as RunPod shows them; secret values as "KEY=********"'
    )
    gpu_count: int
    vcpu_count: float
    memory_in_gb: float
    container_disk_in_gb: int
    volume_in_gb: float
    volume_mount_path: str
    cost_per_hr: float
    desired_status: PodStatus
    last_status_change: str
    machine_id: str | None
    pod_type: PodType
    interruptible: bool
    bid_per_gpu: float | None
    port: int | None
    ports: str = strawberry.field(description='"8888/http,22/tcp"')
    uptime_seconds: int
    cloud_type: str
    status: str = strawberry.field(description="The real status (REST's, lower case)")
    actions: list[str] = strawberry.field(description="Actions allowed in this status")
    error_message: str | None
    created_at: str | None
    machine: Machine | None
    network_volume: NetworkVolume | None = strawberry.field(
        description="The network volume mounted at volumeMountPath (null: its own volume)"
    )
    template_id: str | None = strawberry.field(
        description="The template it was created from (null: none)"
    )
    container_registry_auth_id: str | None = strawberry.field(
        description="The registry credentials its image is pulled with (null: none)"
    )
    _runtime: strawberry.Private[PodRuntime | None]

    @strawberry.field(description="Null unless running.")
    def runtime(self) -> PodRuntime | None:
        return self._runtime


def runtime_ports(d: ClusterDetails) -> list[RuntimePort]:
    """A running cluster's ports as RunPod lists them: a published tcp or udp port at
    the address clients reach the host at (its ``client_address``), ``isIpPublic:
    true`` even when that address is private or loopback (it is where clients reach
    the port; clients such as SkyPilot connect to SSH only through such an entry); an
    http port at the container's own address on its network, ``isIpPublic: false``
    (reached through the HTTP proxy, ``proxyUrl``)."""
    internal = (d.cluster.runtime_handle or {}).get("address")
    out = []
    for p in d.ports:
        if p.protocol == "http":
            out.append(
                RuntimePort(
                    ip=internal,
                    is_ip_public=False,
                    private_port=p.internal_port,
                    public_port=p.external_port or None,
                    type=p.protocol,
                    proxy_url=proxy_url(d, p.internal_port),
                )
            )
            continue
        out.append(
            RuntimePort(
                ip=d.client_address,
                is_ip_public=d.client_address is not None and p.external_port > 0,
                private_port=p.internal_port,
                public_port=p.external_port or None,
                type=p.protocol,
            )
        )
    return out


def pod_from(d: ClusterDetails, now: datetime) -> Pod:
    """The GraphQL view of one cluster's details, at ``now``."""
    c = d.cluster
    status = ClusterStatus(c.status)
    running = status == ClusterStatus.RUNNING
    interruptible = bool(c.interruptible)
    uptime = 0
    if running and c.started_at is not None:
        uptime = max(0, int((now - c.started_at).total_seconds()))
    machine = None
    runtime = None
    if c.host_id is not None:
        host_key = f"{c.id}-{c.host_id}"
        machine = Machine(
            id=str(c.host_id),
            name=d.host_name,
            pod_host_id=host_key,
            cluster_host_id=host_key,
            gpu_type_id=c.gpu_type,
            gpu_display_name=d.gpu_display_name,
            location=d.host_location,
            gpu_source=d.gpu_source,
            _host_id=c.host_id,
        )
    if running:
        runtime = PodRuntime(
            uptime_in_seconds=uptime,
            ports=runtime_ports(d),
            _cluster_id=c.id,
            _host_id=c.host_id,
            _gpu_indices=tuple(c.gpu_indices),
            _declared=d.gpu_source == "declared",
        )
    return Pod(
        id=c.id,
        name=c.name,
        image_name=c.image,
        docker_args=c.docker_args,
        docker_entrypoint=(list(c.docker_entrypoint) if c.docker_entrypoint is not None else None),
        min_cuda_version=c.min_cuda_version,
        docker_id=(c.runtime_handle or {}).get("container_id"),
        env=[f"{k}={v}" for k, v in masked_env(c.env).items()],
        gpu_count=c.gpu_count,
        vcpu_count=c.cpu_cores,
        memory_in_gb=c.memory_gb,
        container_disk_in_gb=c.container_disk_gb,
        volume_in_gb=c.volume_gb,
        volume_mount_path=c.volume_mount_path,
        cost_per_hr=d.rate.total,  # a spot cluster's GPUs at its bid
        # A start requested while stopping: RUNNING is what is wanted (status says
        # where it stands).
        desired_status=PodStatus.RUNNING if c.pending_start is not None else DESIRED_STATUS[status],
        last_status_change=f"{c.status_reason}: {iso(c.updated_at)}",
        machine_id=str(c.host_id) if c.host_id is not None else None,
        pod_type=PodType.INTERRUPTABLE if interruptible else PodType.RESERVED,
        interruptible=interruptible,
        bid_per_gpu=c.bid_per_gpu if interruptible else None,
        port=d.ports[0].internal_port if d.ports else None,
        ports=",".join(f"{p.internal_port}/{p.protocol}" for p in d.ports),
        uptime_seconds=uptime,
        cloud_type=c.cloud_type,
        status=status.value,
        actions=[a.value for a in allowed_actions(status)],
        error_message=c.error_message,
        created_at=iso(c.created_at),
        machine=machine,
        network_volume=_network_volume(d),
        template_id=c.template_id,
        container_registry_auth_id=(
            str(c.registry_auth_id) if c.registry_auth_id is not None else None
        ),
        _runtime=runtime,
    )


def _network_volume(d: ClusterDetails) -> NetworkVolume | None:
    nv = d.network_volume
    if nv is None:
        return None
    return NetworkVolume(id=nv.id, name=nv.name, size=nv.size_gb, data_center_id=nv.location)


@strawberry.type
class LowestPrice:
    gpu_name: str | None = strawberry.field(description="The GPU type's display name")
    gpu_type_id: str | None
    minimum_bid_price: float | None = strawberry.field(
        description="The bid that would win gpuCount GPUs now; null when none can"
    )
    uninterruptable_price: float | None
    min_memory: int | None = strawberry.field(
        description="GB of memory a cluster of gpuCount GPUs gets by default on a host "
        "it fits on now; null when none has room"
    )
    min_vcpu: int | None = strawberry.field(
        description="vCPUs a cluster of gpuCount GPUs gets by default on a host it fits "
        "on now; null when none has room"
    )
    rental_percentage: float | None = strawberry.field(
        description="rentedCount / totalCount (0 to 1); null without GPUs of the type"
    )
    rented_count: int = strawberry.field(description="GPUs of the type held now")
    total_count: int = strawberry.field(description="GPUs of the type on hosts taking clusters")
    stock_status: str | None = strawberry.field(description="High, Medium, Low or null")
    min_download: int | None = strawberry.field(description="Not measured: null")
    min_disk: int | None = strawberry.field(description="The minDisk asked (null: none)")
    min_upload: int | None = strawberry.field(description="Not measured: null")
    country_code: str | None = strawberry.field(description="The countryCode asked")
    support_public_ip: bool | None = strawberry.field(description="Not known: null")
    compliance: list[str] = strawberry.field(
        description="Compliance certifications of the hosts: none known (empty)"
    )
    max_unreserved_gpu_count: int = strawberry.field(
        description="Free GPUs of the type on the best host a cluster of gpuCount fits on"
    )
    available_gpu_counts: list[int]


@strawberry.type
class GpuType:
    id: str
    display_name: str
    manufacturer: str
    memory_in_gb: int
    cuda_cores: int | None = strawberry.field(description="Not known: always null")
    max_gpu_count: int = strawberry.field(description="Most GPUs of this type on one host")
    secure_cloud: bool
    community_cloud: bool
    secure_price: float
    community_price: float
    secure_spot_price: float
    community_spot_price: float
    one_week_price: float | None = strawberry.field(description="No savings plans: null")
    one_month_price: float | None
    three_month_price: float | None
    _info: strawberry.Private[GpuTypeInfo]

    @strawberry.field(description="Prices for gpuCount GPUs of this type right now.")
    def lowest_price(self, info: Info, input: GpuLowestPriceInput | None = None) -> LowestPrice:
        count = input.gpu_count if input is not None and input.gpu_count is not None else 1
        secure = input.secure_cloud if input is not None else None
        cloud = (
            CloudType.ALL if secure is None else CloudType.SECURE if secure else CloudType.COMMUNITY
        )
        gctx = info.context
        view = spot.lowest_price(gctx.ctx, self._info, count, cloud, market=gctx.market())
        total = view.total_count
        return LowestPrice(
            gpu_name=self.display_name,
            gpu_type_id=self.id,
            minimum_bid_price=view.minimum_bid_price,
            uninterruptable_price=view.uninterruptable_price,
            min_memory=view.min_memory_gb,
            min_vcpu=view.min_vcpu,
            rental_percentage=round(view.rented_count / total, 4) if total else None,
            rented_count=view.rented_count,
            total_count=total,
            stock_status=view.stock_status,
            min_download=None,
            min_disk=input.min_disk if input is not None else None,
            min_upload=None,
            country_code=input.country_code if input is not None else None,
            support_public_ip=None,
            compliance=[],
            max_unreserved_gpu_count=view.max_unreserved_gpu_count,
            available_gpu_counts=list(view.available_gpu_counts),
        )


def gpu_type_from(g: GpuTypeInfo, hosts: list[HostCapacity]) -> GpuType:
    """The GraphQL view of a catalog entry given every host's capacity."""
    per_host = [(h.cloud_type, sum(1 for x in h.gpus if x.gpu_type == g.id)) for h in hosts]
    return GpuType(
        id=g.id,
        display_name=g.display_name,
        manufacturer=g.manufacturer,
        memory_in_gb=g.memory_gb,
        cuda_cores=None,
        max_gpu_count=max((n for _, n in per_host), default=0),
        secure_cloud=any(n and t == CloudType.SECURE for t, n in per_host),
        community_cloud=any(n and t == CloudType.COMMUNITY for t, n in per_host),
        secure_price=g.secure_price,
        community_price=g.community_price,
        secure_spot_price=g.secure_spot_price,
        community_spot_price=g.community_spot_price,
        one_week_price=None,
        one_month_price=None,
        three_month_price=None,
        _info=g,
    )


@strawberry.type(description="Storage that outlives clusters, on one host of a data centre.")
class NetworkVolume:
    id: str
    name: str
    size: int = strawberry.field(description="Size in GB")
    data_center_id: str = strawberry.field(description="The host location it lives in")


@strawberry.type(name="User", description="The caller: their account's clusters.")
class User:
    id: str
    pub_key: str | None = strawberry.field(
        description="The account's SSH public keys (/v1/ssh-keys), one per line: they log "
        "in through the SSH gateway and are the clusters' PUBLIC_KEY. Null when none."
    )

    @strawberry.field(description="The account's network volumes, newest first.")
    def network_volumes(self, info: Info) -> list[NetworkVolume]:
        gctx = info.context
        require(gctx, Permission.READ_RESOURCES)
        return [
            NetworkVolume(id=v.id, name=v.name, size=v.size_gb, data_center_id=v.location)
            for v in list_network_volumes(gctx.ctx, gctx.principal)
        ]

    @strawberry.field(description="The account's pod templates, oldest first.")
    def pod_templates(self, info: Info) -> list[PodTemplate]:
        return pod_templates(info.context)

    @strawberry.field(description="The account's serverless endpoints, oldest first.")
    def endpoints(self, info: Info) -> list[Endpoint]:
        return my_endpoints(info.context)

    @strawberry.field(description="RunPod's serverless discount: none is offered (null).")
    def serverless_discount(self) -> ServerlessDiscount | None:
        return None

    @strawberry.field(
        description="The account's clusters (not terminated or being terminated), newest first."
    )
    async def clusters(self, info: Info) -> list[Pod]:
        return await listed_pods(info)

    @strawberry.field(description="The same as clusters (RunPod's name).")
    async def pods(self, info: Info) -> list[Pod]:
        return await listed_pods(info)

    @strawberry.field(
        description="What the account's clusters cost per hour now, its serverless "
        "endpoints' workers included."
    )
    def current_spend_per_hr(self, info: Info) -> float:
        gctx = info.context
        require(gctx, Permission.READ_BILLING)
        # A pod's costPerHr is its details' rate (pod_from); workers are not listed.
        pods = sum(d.rate.total for d in gctx.clusters())
        return round(pods + workers_spend_per_hr(gctx.ctx, gctx.principal.account_id), 6)


async def listed_pods(info: Info) -> list[Pod]:
    """The caller's clusters as pods (not those being terminated). When the selection
    asks for container stats, every running pod's are fetched first, in one batch (the
    stats loader: concurrent engine calls through the shared cache), so no pod waits on
    its own."""
    require(info.context, Permission.READ_RESOURCES)
    gctx = info.context
    now = gctx.ctx.clock.now()
    # A terminated pod leaves RunPod's list at once: one being terminated is not
    # listed either (clients such as SkyPilot know no status for it).
    pods = [
        pod_from(d, now) for d in gctx.clusters() if d.cluster.status != ClusterStatus.TERMINATING
    ]
    if _selects(info.selected_fields, "container"):
        await gctx.prefetch_stats([p._runtime._stats_key for p in pods if p._runtime])
    return pods


def _selects(selections: Iterable[Selection], name: str) -> bool:
    """Whether a field named ``name`` is selected anywhere below (fragments included;
    in a pod, only ``runtime`` has a ``container``)."""
    for sel in selections:
        if getattr(sel, "name", None) == name and not hasattr(sel, "type_condition"):
            return True
        if _selects(sel.selections, name):
            return True
    return False
