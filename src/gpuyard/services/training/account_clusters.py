"""Training clusters by id across the account, for surfaces that name a cluster
without seed 002's ``project_id``/``location`` scope (RunPod's v2 clusters).

``find_scope`` answers the scope a live cluster of the caller's account lives in, so
the scoped use cases (services/training/use_cases.py, reads.py) can be called with it
and make their own checks again; ``account_scopes`` lists them all; ``rename_cluster``
changes a cluster's name (its display name only: engine names use its prefix). Each
opens its own transaction; another account's cluster, or one in a project the caller
may not use, reads as unknown.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select

from gpuyard.core.errors import ValidationFailed
from gpuyard.core.input_rules import MAX_DB_ID
from gpuyard.services.catalog.gpu_types import find_gpu_type
from gpuyard.services.catalog.plans import CPUS_PER_GPU, MEMORY_GB_PER_GPU
from gpuyard.services.context import Context
from gpuyard.services.tenancy.auth import Principal
from gpuyard.services.tenancy.projects import in_usable_projects, project_for_create

# The create's name rule (this room's own).
from gpuyard.services.training.inputs import _name
from gpuyard.services.training.use_cases import (
    Scope,
    TrainingClusterNotFound,
    create_cluster,
    load_cluster,
)
from gpuyard.store.schema import Host, HostGpu, ImageVersion, SshKey, TrainingCluster


def _missing(cluster_id: int | str) -> TrainingClusterNotFound:
    return TrainingClusterNotFound(
        f"cluster {str(cluster_id)[:40]} not found", {"cluster_id": str(cluster_id)[:40]}
    )


def cluster_number(cluster_id: str) -> int:
    """The integer id ``cluster_id`` spells (a path's text); TrainingClusterNotFound
    when it spells none."""
    if cluster_id.isascii() and cluster_id.isdigit() and len(cluster_id) <= 19:
        number = int(cluster_id)
        if 1 <= number <= MAX_DB_ID:
            return number
    raise _missing(cluster_id)


def find_scope(ctx: Context, principal: Principal, cluster_id: int) -> Scope:
    """The scope of live cluster ``cluster_id`` of the caller's account, in a project
    it may use. Raises TrainingClusterNotFound otherwise."""
    with ctx.read() as session:
        found = session.execute(
            select(TrainingCluster.project_id, TrainingCluster.location).where(
                TrainingCluster.id == cluster_id,
                TrainingCluster.account_id == principal.account_id,
                TrainingCluster.deleted_at.is_(None),
                in_usable_projects(principal, TrainingCluster.project_id),
            )
        ).first()
    if found is None:
        raise _missing(cluster_id)
    return Scope(project_id=found.project_id, location=found.location)


def account_scopes(ctx: Context, principal: Principal) -> list[tuple[int, Scope]]:
    """Every live training cluster of the caller's account in the projects it may
    use, oldest first, with its scope."""
    with ctx.read() as session:
        rows = session.execute(
            select(TrainingCluster.id, TrainingCluster.project_id, TrainingCluster.location)
            .where(
                TrainingCluster.account_id == principal.account_id,
                TrainingCluster.deleted_at.is_(None),
                in_usable_projects(principal, TrainingCluster.project_id),
            )
            .order_by(TrainingCluster.id)
        ).all()
    return [(r.id, Scope(project_id=r.project_id, location=r.location)) for r in rows]


def rename_cluster(
    ctx: Context, principal: Principal, scope: Scope, cluster_id: int, name: object
) -> None:
    """Give a cluster a new name (the rules of a create's). Needs the write
    permission. Raises Forbidden, ValidationFailed("name"), TrainingClusterNotFound."""
    principal.require_write()
    clean = _name({"name": name})
    with ctx.transaction() as session:
        cluster = load_cluster(session, principal, scope, cluster_id, for_update=True)
        if cluster.name != clean:
            cluster.name = clean
            cluster.updated_at = ctx.clock.now()


@dataclass(frozen=True)
class AccountCreate:
    """A cluster asked for without seed 002's scope: ``workers`` nodes of
    ``gpus_per_node`` GPUs of ``gpu_type`` (plus the controller), in the first of
    ``locations`` (none: where the fleet has that GPU type), from node image ``image``
    (an image version's reference; None: the oldest registered, the Slurm node image)."""

    name: str
    gpu_type: str
    gpus_per_node: int
    workers: int
    locations: tuple[str, ...] = ()
    image: str | None = None


def create_in_account(ctx: Context, principal: Principal, req: AccountCreate) -> tuple[int, Scope]:
    """Create a training cluster in the caller's default project (its key's project
    when restricted to one), authorised for the caller's own SSH keys, with the node
    plan's per-GPU vCPUs and memory (services/catalog/plans.py); the create itself is
    services/training/use_cases.py's (one transaction, every node placed or nothing).
    Returns its id and scope. Raises ValidationFailed naming ``image``, ``keys``,
    ``gpu_type`` or ``location``, and what create_cluster raises."""
    principal.require_write()
    with ctx.read() as session:
        project_id = project_for_create(session, principal, None)
        gpu = find_gpu_type(session, req.gpu_type)
        if gpu is None:
            raise ValidationFailed("gpu_type", f"unknown GPU type {req.gpu_type[:100]!r}")
        images = select(ImageVersion).order_by(ImageVersion.id)
        if req.image is not None:
            images = images.where(ImageVersion.image == req.image)
        image = session.scalars(images.limit(1)).first()
        if image is None:
            known = list(session.scalars(select(ImageVersion.image).order_by(ImageVersion.id)))
            raise ValidationFailed(
                "image", "training nodes run a registered node image", {"images": known}
            )
        keys = select(SshKey.id).where(
            SshKey.account_id == principal.account_id, SshKey.user_id == principal.user_id
        )
        if principal.key_project_id is not None:
            keys = keys.where(SshKey.project_id == principal.key_project_id)
        key_ids = list(session.scalars(keys.order_by(SshKey.id)))
        if not key_ids:
            raise ValidationFailed("keys", "the caller has no SSH key to open the cluster with")
        having = set(
            session.scalars(
                select(Host.location)
                .join(HostGpu, HostGpu.host_id == Host.id)
                .where(HostGpu.gpu_type == gpu.id)
            )
        )
        known_locations = set(session.scalars(select(Host.location)))
    location = _location(req.locations, having, known_locations)
    scope = Scope(project_id=project_id, location=location)
    spec = {
        "name": req.name,
        "image_version_id": image.id,
        "ssh_key_ids": key_ids,
        "no_of_nodes": req.workers,
        "gpu_type": gpu.id,
        "gpus_per_node": req.gpus_per_node,
        "cpus_per_node": CPUS_PER_GPU * req.gpus_per_node,
        "memory_gb_per_node": MEMORY_GB_PER_GPU * req.gpus_per_node,
    }
    return create_cluster(ctx, principal, scope, spec), scope


def _location(wanted: tuple[str, ...], having: set[str], known: set[str]) -> str:
    """The first of ``wanted`` with hosts of the GPU type (else the first known one);
    without ``wanted``, the first location with them by name."""
    if wanted:
        for location in wanted:
            if location in having:
                return location
        for location in wanted:
            if location in known:
                return location
        raise ValidationFailed(
            "location", f"unknown data center {wanted[0][:100]!r}", {"locations": sorted(known)}
        )
    if having:
        return sorted(having)[0]
    raise ValidationFailed("gpu_type", "no host of this installation has this GPU type")
