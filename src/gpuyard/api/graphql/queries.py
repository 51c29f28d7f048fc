# Strawberry's field decorators are typed as returning Any; the resolvers are typed.
# mypy: disable-error-code="untyped-decorator"
"""Root query: the caller (``myself``), one cluster by id (``cluster``/``pod``) and
the GPU catalog (``gpuTypes``). Every read is scoped to the caller's account; what
each field needs of the caller's role is in api/graphql/access.py."""

from __future__ import annotations

import strawberry

from gpuyard.api.graphql.access import require
from gpuyard.api.graphql.inputs import ClusterFilter, GpuTypeFilter, PodFilter
from gpuyard.api.graphql.types import GpuType, Info, Pod, User, gpu_type_from, pod_from
from gpuyard.core.roles import Permission
from gpuyard.services.access.ssh_key_use_cases import own_public_keys
from gpuyard.services.catalog.gpu_types import catalog_types


def one_pod(info: Info, cluster_id: str) -> Pod:
    """The caller's cluster, read now (the mutations' answer, after their change).
    Raises Forbidden (a role that may not read resources), ClusterNotFound (also for
    another account's id)."""
    require(info.context, Permission.READ_RESOURCES)
    d = info.context.cluster(cluster_id)
    return pod_from(d, info.context.ctx.clock.now())


async def loaded_pod(info: Info, cluster_id: str) -> Pod:
    """The caller's cluster through the details loader: the ``cluster`` fields of one
    document are read in one batch, and a cluster the document also lists is not read
    again. Raises as :func:`one_pod`."""
    require(info.context, Permission.READ_RESOURCES)
    d = await info.context.loaders.details.load(cluster_id)
    return pod_from(d, info.context.ctx.clock.now())


def user_of(info: Info) -> User:
    """The caller, with their SSH keys in the account as RunPod's ``pubKey`` (a key
    restricted to a project: their keys of that project, the ones it may replace)."""
    principal = info.context.principal
    keys = own_public_keys(info.context.ctx, principal)
    return User(id=str(principal.user_id), pub_key=keys or None)


@strawberry.type
class Query:
    @strawberry.field(description="The caller and their account's clusters.")
    def myself(self, info: Info) -> User:
        return user_of(info)

    @strawberry.field(description="One cluster by id (terminated ones included).")
    async def cluster(self, info: Info, input: ClusterFilter) -> Pod | None:
        return await loaded_pod(info, input.cluster_id)

    @strawberry.field(description="One pod by id (RunPod's name for cluster).")
    async def pod(self, info: Info, input: PodFilter) -> Pod | None:
        return await loaded_pod(info, input.pod_id)

    @strawberry.field(
        description="The GPU catalog, or the types named by input.id / input.ids "
        "(by id or display name, case-insensitive); unknown names give no entry."
    )
    def gpu_types(self, info: Info, input: GpuTypeFilter | None = None) -> list[GpuType]:
        ctx = info.context
        hosts = list(ctx.capacities().values())
        names = [n for n in [input.id, *(input.ids or [])] if n] if input else []
        named = input is not None and (input.id is not None or input.ids is not None)
        types = catalog_types(ctx.ctx, names if named else None)
        return [gpu_type_from(g, hosts) for g in types]
