# Strawberry's field decorators are typed as returning Any; the resolvers are typed.
# mypy: disable-error-code="untyped-decorator"
"""Root mutations: the seed's ``cluster*`` names and RunPod's ``pod*`` names, each
pair answering through the same use case. Each returns at once (the reconciler does
the runtime work); the answer shows the recorded intent (``desiredStatus``) and the
real ``status``. Each needs WRITE_RESOURCES of the caller's role
(api/graphql/access.py)."""

from __future__ import annotations

import strawberry

from gpuyard.api.graphql.access import require
from gpuyard.api.graphql.errors import renamed
from gpuyard.api.graphql.inputs import (
    GRAPHQL_NAMES,
    ClusterBidResumeInput,
    ClusterFindAndDeployOnDemandInput,
    ClusterRentInterruptableInput,
    ClusterResumeInput,
    ClusterStopInput,
    ClusterTerminateInput,
    DeployCpuPodInput,
    DeployFields,
    PodBidResumeInput,
    PodFindAndDeployOnDemandInput,
    PodRentInterruptableInput,
    PodResumeInput,
    PodStopInput,
    PodTerminateInput,
    SaveRegistryAuthInput,
    UpdateRegistryAuthInput,
    UpdateUserSettingsInput,
    create_bodies,
)
from gpuyard.api.graphql.queries import one_pod, user_of
from gpuyard.api.graphql.serverless import (
    Endpoint,
    EndpointInput,
    UpdateEndpointTemplateInput,
    delete_endpoint,
    save_endpoint,
    update_endpoint_template,
)
from gpuyard.api.graphql.templates import (
    PodTemplate,
    SaveTemplateInput,
    delete_template,
    save_template,
)
from gpuyard.api.graphql.types import ContainerRegistryAuth, Info, Pod, User
from gpuyard.core.errors import InsufficientCapacity, ValidationFailed
from gpuyard.core.input_rules import parse_id
from gpuyard.core.roles import Permission
from gpuyard.services import idempotency as idem
from gpuyard.services.access.ssh_key_use_cases import replace_own_keys
from gpuyard.services.billing import spot
from gpuyard.services.clusters import use_cases as uc
from gpuyard.services.clusters.requests import ConfigurationUpdate, StartCluster
from gpuyard.services.tenancy import registry_auths

MAX_GPUS = 64
_REGISTRY_AUTH_FIELDS = {"name": "name", "username": "username", "password": "password"}


def deploy(
    info: Info, data: DeployFields, *, cpu_only: bool = False, bid_per_gpu: float | None = None
) -> Pod:
    """Create a cluster with the first GPU type that has capacity. Raises the last
    InsufficientCapacity when none has, or the first other error at once.

    With the request's ``Idempotency-Key``, a retry of the same mutation with the same
    input answers the same pod (IDEMPOTENCY_KEY_REUSED for another mutation or input
    under that key)."""
    gctx = info.context
    require(gctx, Permission.WRITE_RESOURCES)
    claim = idem.claim_for(
        gctx.ctx,
        gctx.principal,
        idem.ROUTE_GRAPHQL,
        gctx.idempotency_key,
        {"mutation": info.field_name, "input": strawberry.asdict(data)},
    )

    def create(key: idem.Claim | None) -> str:
        now = gctx.ctx.clock.now()
        bodies = create_bodies(data, now, cpu_only=cpu_only, bid_per_gpu=bid_per_gpu)
        short: InsufficientCapacity | None = None
        for body in bodies:
            try:
                # dataCenterId pins the location ("" as absent: anywhere).
                where = data.data_center_id or None
                return uc.create_cluster(
                    gctx.ctx, gctx.principal, body, idempotency=key, location=where
                ).id
            except InsufficientCapacity as exc:
                short = exc
            except ValidationFailed as exc:
                raise renamed(exc, GRAPHQL_NAMES) from exc
        assert short is not None
        raise short

    cluster_id, _ = idem.create_once(gctx.ctx, claim, create)
    return one_pod(info, cluster_id)


def _gpu_count(gpu_count: int | None) -> int | None:
    if gpu_count is not None and not 0 <= gpu_count <= MAX_GPUS:
        raise ValidationFailed("input.gpuCount", f"must be between 0 and {MAX_GPUS}")
    return gpu_count


def resume(info: Info, cluster_id: str, gpu_count: int | None) -> Pod:
    """Start a stopped cluster on its host, with ``gpu_count`` GPUs when it differs.
    Raises InvalidState, InsufficientCapacity ("not enough free GPUs on the host
    machine"), ValidationFailed or ClusterNotFound; nothing changes on error."""
    gctx = info.context
    require(gctx, Permission.WRITE_RESOURCES)
    wanted = _gpu_count(gpu_count)
    current = uc.get_cluster(gctx.ctx, gctx.principal, cluster_id)
    body = StartCluster()
    if wanted is not None and wanted != current.gpu_count:
        body = StartCluster(update_configuration=ConfigurationUpdate(gpu_count=wanted))
    uc.start_cluster(gctx.ctx, gctx.principal, cluster_id, body)
    return one_pod(info, cluster_id)


def bid_resume(info: Info, cluster_id: str, bid_per_gpu: float, gpu_count: int | None) -> Pod:
    """Resume a stopped cluster as interruptible at ``bid_per_gpu`` (preempting lower
    bids when its host is full). Raises as :func:`resume` does, and VALIDATION_ERROR
    for a bid below the spot floor."""
    gctx = info.context
    require(gctx, Permission.WRITE_RESOURCES)
    count = _gpu_count(gpu_count)
    try:
        spot.bid_resume_cluster(gctx.ctx, gctx.principal, cluster_id, bid_per_gpu, count)
    except ValidationFailed as exc:
        raise renamed(exc, {"bid_per_gpu": "bidPerGpu", "gpu_count": "gpuCount"}) from exc
    return one_pod(info, cluster_id)


def stop(info: Info, cluster_id: str) -> Pod:
    gctx = info.context
    require(gctx, Permission.WRITE_RESOURCES)
    uc.stop_cluster(gctx.ctx, gctx.principal, cluster_id)
    return one_pod(info, cluster_id)


def terminate(info: Info, cluster_id: str) -> None:
    gctx = info.context
    require(gctx, Permission.WRITE_RESOURCES)
    uc.terminate_cluster(gctx.ctx, gctx.principal, cluster_id)


@strawberry.type
class Mutation:
    @strawberry.mutation(description="Deploy an on-demand cluster (seed 001).")
    def cluster_find_and_deploy_on_demand(
        self, info: Info, input: ClusterFindAndDeployOnDemandInput
    ) -> Pod | None:
        return deploy(info, input)

    @strawberry.mutation(description="Deploy an on-demand pod (RunPod).")
    def pod_find_and_deploy_on_demand(
        self, info: Info, input: PodFindAndDeployOnDemandInput
    ) -> Pod | None:
        return deploy(info, input)

    @strawberry.mutation(description="Deploy a pod without GPUs (RunPod).")
    def deploy_cpu_pod(self, info: Info, input: DeployCpuPodInput) -> Pod | None:
        return deploy(info, input, cpu_only=True)

    @strawberry.mutation(description="Deploy an interruptible (spot) cluster at bidPerGpu.")
    def cluster_rent_interruptable(
        self, info: Info, input: ClusterRentInterruptableInput
    ) -> Pod | None:
        return deploy(info, input, bid_per_gpu=input.bid_per_gpu)

    @strawberry.mutation(description="Deploy an interruptible (spot) pod at bidPerGpu.")
    def pod_rent_interruptable(self, info: Info, input: PodRentInterruptableInput) -> Pod | None:
        return deploy(info, input, bid_per_gpu=input.bid_per_gpu)

    @strawberry.mutation(description="Start a stopped cluster on demand.")
    def cluster_resume(self, info: Info, input: ClusterResumeInput) -> Pod | None:
        return resume(info, input.cluster_id, input.gpu_count)

    @strawberry.mutation(description="Start a stopped pod on demand (RunPod).")
    def pod_resume(self, info: Info, input: PodResumeInput) -> Pod | None:
        return resume(info, input.pod_id, input.gpu_count)

    @strawberry.mutation(description="Start a stopped cluster as spot at bidPerGpu.")
    def cluster_bid_resume(self, info: Info, input: ClusterBidResumeInput) -> Pod | None:
        return bid_resume(info, input.cluster_id, input.bid_per_gpu, input.gpu_count)

    @strawberry.mutation(description="Start a stopped pod as spot at bidPerGpu (RunPod).")
    def pod_bid_resume(self, info: Info, input: PodBidResumeInput) -> Pod | None:
        return bid_resume(info, input.pod_id, input.bid_per_gpu, input.gpu_count)

    @strawberry.mutation(description="Stop a cluster (volume kept, GPUs released).")
    def cluster_stop(self, info: Info, input: ClusterStopInput) -> Pod | None:
        return stop(info, input.cluster_id)

    @strawberry.mutation(description="Stop a pod (RunPod).")
    def pod_stop(self, info: Info, input: PodStopInput) -> Pod | None:
        return stop(info, input.pod_id)

    @strawberry.mutation(description="Terminate a cluster (volume deleted). Returns null.")
    def cluster_terminate(self, info: Info, input: ClusterTerminateInput) -> None:
        terminate(info, input.cluster_id)

    @strawberry.mutation(description="Terminate a pod (RunPod). Returns null.")
    def pod_terminate(self, info: Info, input: PodTerminateInput) -> None:
        terminate(info, input.pod_id)

    @strawberry.mutation(
        description="RunPod's user settings: pubKey sets the account's SSH keys "
        "(the same keys as /v1/ssh-keys)."
    )
    def update_user_settings(self, info: Info, input: UpdateUserSettingsInput) -> User:
        gctx = info.context
        if input.pub_key is not None:
            # The account's SSH keys log into every cluster of it: a change to the
            # clusters' access, as POST /v1/ssh-keys (api/http/permissions.py).
            require(gctx, Permission.WRITE_RESOURCES)
            # RunPod's pubKey is the caller's own: other members' keys stay.
            replace_own_keys(gctx.ctx, gctx.principal, input.pub_key)
        return user_of(info)

    @strawberry.mutation(
        description="Save a pod template: create one, or update input.id's with the "
        "fields given (the same templates as /v1/templates)."
    )
    def save_template(self, info: Info, input: SaveTemplateInput) -> PodTemplate:
        return save_template(info.context, input)

    @strawberry.mutation(description="Delete the account's template of that name. Returns null.")
    def delete_template(self, info: Info, template_name: str) -> None:
        delete_template(info.context, template_name)

    @strawberry.mutation(
        description="Save a serverless endpoint: create one, or update input.id's with the "
        "fields given (the same endpoints as /v1/endpoints)."
    )
    def save_endpoint(self, info: Info, input: EndpointInput) -> Endpoint:
        return save_endpoint(info.context, input)

    @strawberry.mutation(description="Point an endpoint's new workers at another template.")
    def update_endpoint_template(self, info: Info, input: UpdateEndpointTemplateInput) -> Endpoint:
        return update_endpoint_template(info.context, input)

    @strawberry.mutation(
        description="Delete a serverless endpoint (its workers drain and stop). Returns null."
    )
    def delete_endpoint(self, info: Info, id: str) -> None:
        delete_endpoint(info.context, id)

    @strawberry.mutation(
        description="Store private registry credentials (the same as POST /v1/registry-auths); "
        "name them on a deploy as containerRegistryAuthId."
    )
    def save_registry_auth(self, info: Info, input: SaveRegistryAuthInput) -> ContainerRegistryAuth:
        gctx = info.context
        require(gctx, Permission.WRITE_RESOURCES)
        try:
            row = registry_auths.create_registry_auth(
                gctx.ctx, gctx.principal, None, input.name, input.username, input.password
            )
        except ValidationFailed as exc:
            raise renamed(exc, _REGISTRY_AUTH_FIELDS) from exc
        return ContainerRegistryAuth(id=str(row.id), name=row.name)

    @strawberry.mutation(
        description="Replace the username and password of registry credentials (the name "
        "stays); the next pull of each cluster naming them uses the new ones."
    )
    def update_registry_auth(
        self, info: Info, input: UpdateRegistryAuthInput
    ) -> ContainerRegistryAuth:
        gctx = info.context
        require(gctx, Permission.WRITE_RESOURCES)
        auth_id = parse_id("input.id", input.id, required=True)
        assert auth_id is not None
        try:
            row = registry_auths.update_registry_auth(
                gctx.ctx, gctx.principal, None, auth_id, input.username, input.password
            )
        except ValidationFailed as exc:
            raise renamed(exc, _REGISTRY_AUTH_FIELDS) from exc
        return ContainerRegistryAuth(id=str(row.id), name=row.name)

    @strawberry.mutation(
        description="Delete registry credentials; clusters that name them pull anonymously."
    )
    def delete_registry_auth(self, info: Info, registry_auth_id: str) -> bool:
        gctx = info.context
        require(gctx, Permission.WRITE_RESOURCES)
        auth_id = parse_id("registryAuthId", registry_auth_id, required=True)
        assert auth_id is not None
        registry_auths.delete_registry_auth(gctx.ctx, gctx.principal, None, auth_id)
        return True
