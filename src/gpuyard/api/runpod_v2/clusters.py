"""``/runpod/v2/clusters``: RunPod's clusters of type SLURM over gpuyard's Slurm
training clusters (seed 002; services/training). Other types (APPLICATION, TRAINING,
RAY) are a 422 saying only SLURM is served.

A create (services/training/account_clusters.py ``create_in_account``) makes a
training cluster in the caller's default project: ``compute.podCount`` GPU nodes
(Slurm compute nodes) of ``compute.gpuCountPerPod`` GPUs of ``compute.gpuTypeId``,
plus gpuyard's controller node (no GPU), in the first of ``dataCenterIds`` (default:
a location with that GPU type), authorised for the caller's SSH keys
(``/runpod/v2/account/ssh-keys``; none is a 400 naming ``keys``), from the node image
``image`` names (a registered node image; default the Slurm node image). The other
container settings (args, disk, env, ports, mounts, startJupyter, startSsh) are
accepted and not applied: Slurm nodes run gpuyard's node image as it is.

A Cluster answers ``compute`` as created, ``pods`` as its nodes (the controller
included) counted by RunPod's PodStatus, ``network.cidr`` its private subnet and
``primary`` its controller with the SSH endpoint. ``/clusters/{id}/pods`` lists the
nodes as minimal Pods: what gpuyard knows of a node (status, image, GPUs, address,
SSH on the controller); nodes hold no container-disk claim, and ``disk`` is answered as
the document's minimum, 1. ``PATCH`` renames; ``DELETE`` tears it down (204).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import Depends, Request
from fastapi.responses import JSONResponse, Response
from pydantic import Field, WithJsonSchema

from gpuyard.api.runpod_v2.common import (
    Unprocessable,
    V2Body,
    answer,
    documented,
    no_content,
    renamed,
    v2_router,
)
from gpuyard.api.state import AppState, app_state, current_principal
from gpuyard.services.catalog.images import list_images
from gpuyard.services.tenancy.auth import Principal
from gpuyard.services.training import account_clusters as clusters
from gpuyard.services.training import use_cases as training
from gpuyard.services.training.reads import show_cluster

router = v2_router()

NAMES = {
    "gpu_type": "compute.gpuTypeId",
    "gpus_per_node": "compute.gpuCountPerPod",
    "no_of_nodes": "compute.podCount",
    "location": "dataCenterIds",
    "name": "name",
    "image": "image",
    "image_version_id": "image",
    "keys": "keys",
    "ssh_key_ids": "keys",
}
# Seed 002's node statuses as RunPod's PodStatus.
_POD_STATUS = {
    "creating": "PROVISIONING",
    "restarting": "STARTING",
    "replacing": "STARTING",
    "running": "RUNNING",
    "error": "ERROR",
    "stopped": "EXITED",
}


class ClusterCompute(V2Body):
    gpuTypeId: str = Field(min_length=1, max_length=100)
    gpuCountPerPod: int = Field(ge=1, le=16, strict=True)
    podCount: int = Field(ge=2, le=250, strict=True)


class NetworkMount(V2Body):
    volumeId: str
    path: str


class PersistentMount(V2Body):
    size: int = Field(ge=10, strict=True)
    path: str


class Mounts(V2Body):
    persistent: PersistentMount | None = None
    network: list[NetworkMount] | None = Field(default=None, max_length=1)


# RunPod's other types are taken (and refused with a problem saying why), but the
# document gpuyard serves names only the one it serves.
ClusterType = Annotated[
    Literal["APPLICATION", "TRAINING", "SLURM", "RAY"],
    WithJsonSchema({"type": "string", "enum": ["SLURM"], "description": "SLURM only"}),
]


class CreateClusterRequest(V2Body):
    name: str = Field(min_length=1, max_length=100)
    type: ClusterType
    compute: ClusterCompute
    image: str | None = Field(default=None, min_length=1, max_length=512)
    args: str | None = None
    disk: int | None = Field(default=None, ge=1, strict=True)
    env: dict[str, str] | None = None
    ports: list[str] | None = None
    dataCenterIds: list[str] | None = Field(default=None, max_length=50)
    mounts: Mounts | None = None
    startJupyter: bool | None = Field(default=None, strict=True)
    startSsh: bool | None = Field(default=None, strict=True)


class UpdateClusterRequest(V2Body):
    name: str = Field(min_length=1, max_length=100)


def _partition(state: AppState) -> Any:
    return None if state.training is None else state.training.partition_state


def _by_status(nodes: list[dict[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for n in nodes:
        status = _POD_STATUS.get(n["status"], "PROVISIONING")
        out[status] = out.get(status, 0) + 1
    return out


def cluster_view(seed: dict[str, Any]) -> dict[str, Any]:
    """RunPod's Cluster of seed 002's cluster object."""
    nodes = seed["nodes"]
    out: dict[str, Any] = {
        "id": str(seed["id"]),
        "name": seed["name"],
        "type": "SLURM",
        "compute": {
            "gpuTypeId": seed["plan"]["gpu_type"],
            "gpuCountPerPod": seed["plan"]["gpus_per_node"],
            "podCount": seed["no_of_nodes"],
        },
        "dataCenterId": seed["location"],
        "pods": {"total": len(nodes), "byStatus": _by_status(nodes)},
        "createdAt": seed["created_at"],
    }
    if seed["network"]["subnet"]:
        out["network"] = {"cidr": seed["network"]["subnet"]}
    controller = next((n for n in nodes if n["role"] == "controller"), None)
    if controller is not None:
        primary: dict[str, Any] = {
            "podId": str(controller["id"]),
            "status": _POD_STATUS.get(controller["status"], "PROVISIONING"),
        }
        if seed["ssh"]:
            primary["sshEndpoint"] = (
                f"{seed['ssh']['user']}@{seed['ssh']['host']}:{seed['ssh']['port']}"
            )
        out["primary"] = primary
    return out


def pod_view(seed: dict[str, Any], node: dict[str, Any], images: dict[int, str]) -> dict[str, Any]:
    """A minimal RunPod Pod of one node of a training cluster."""
    controller = node["role"] == "controller"
    ssh = None
    if controller and seed["ssh"]:
        s = seed["ssh"]
        ssh = {"host": s["host"], "port": s["port"], "username": s["user"], "command": s["command"]}
    pod: dict[str, Any] = {
        "id": str(node["id"]),
        "name": node["name"],
        "status": _POD_STATUS.get(node["status"], "PROVISIONING"),
        "actions": [],
        "image": images.get(node["image_version_id"], ""),
        "args": "",
        "disk": 1,
        "mounts": {},
        "ports": ["22/tcp"] if controller else [],
        "env": {},
        "registry": None,
        "cloud": "SECURE",
        "dataCenterId": seed["location"],
        "cudaVersion": None,
        "ssh": {"proxy": None, "direct": ssh},
        "template": None,
        "cost": seed["plan"]["price_per_node_hour"] if not controller else 0.0,
        "locked": False,
        "runtime": None,
        "createdAt": seed["created_at"],
        "startedAt": None,
        "globalNetworking": {"enabled": False},
        "cluster": {
            "id": str(seed["id"]),
            "rank": None,
            "role": "SLURM_CONTROLLER" if controller else "SLURM_COMPUTE",
        },
    }
    if node["private_ip"]:
        pod["cluster"]["ip"] = node["private_ip"]
    if node["gpu_indices"]:
        pod["gpu"] = {"id": seed["plan"]["gpu_type"], "count": len(node["gpu_indices"])}
    return pod


def _seed_view(state: AppState, principal: Principal, cluster_id: str) -> dict[str, Any]:
    number = clusters.cluster_number(cluster_id)
    scope = clusters.find_scope(state.ctx, principal, number)
    return show_cluster(state.ctx, principal, scope, number, _partition(state))


@router.get("/clusters", responses=documented("ListClustersResponse: {clusters}"))
def list_clusters(
    request: Request, principal: Principal = Depends(current_principal)
) -> JSONResponse:
    """The account's Slurm clusters in the projects the caller may use, oldest first."""
    state = app_state(request)
    out = []
    for cluster_id, scope in clusters.account_scopes(state.ctx, principal):
        try:
            seed = show_cluster(state.ctx, principal, scope, cluster_id, _partition(state))
        except training.TrainingClusterNotFound:
            continue  # deleted meanwhile
        out.append(cluster_view(seed))
    return answer({"clusters": out})


@router.post("/clusters", status_code=201, responses=documented("Cluster", 201))
def create_cluster(
    body: CreateClusterRequest, request: Request, principal: Principal = Depends(current_principal)
) -> JSONResponse:
    """A Slurm cluster (type SLURM only): see the module's description."""
    if body.type != "SLURM":
        raise Unprocessable(
            "type", f"only SLURM clusters are served here, not {body.type}", {"allowed": ["SLURM"]}
        )
    state = app_state(request)
    req = clusters.AccountCreate(
        name=body.name,
        gpu_type=body.compute.gpuTypeId,
        gpus_per_node=body.compute.gpuCountPerPod,
        workers=body.compute.podCount,
        locations=tuple(body.dataCenterIds or ()),
        image=body.image,
    )
    with renamed(NAMES):
        cluster_id, scope = clusters.create_in_account(state.ctx, principal, req)
    seed = show_cluster(state.ctx, principal, scope, cluster_id, _partition(state))
    return answer(cluster_view(seed), 201)


@router.get("/clusters/{id}", responses=documented("Cluster"))
def get_cluster(
    id: str, request: Request, principal: Principal = Depends(current_principal)
) -> JSONResponse:
    return answer(cluster_view(_seed_view(app_state(request), principal, id)))


@router.get("/clusters/{id}/pods", responses=documented("ListPodsResponse: {pods}"))
def cluster_pods(
    id: str, request: Request, principal: Principal = Depends(current_principal)
) -> JSONResponse:
    """The cluster's nodes as Pods, the controller first."""
    state = app_state(request)
    seed = _seed_view(state, principal, id)
    images = {i.id: i.image for i in list_images(state.ctx)}
    nodes = sorted(seed["nodes"], key=lambda n: (n["role"] != "controller", n["id"]))
    return answer({"pods": [pod_view(seed, n, images) for n in nodes]})


@router.patch("/clusters/{id}", responses=documented("Cluster"))
def rename_cluster(
    id: str,
    body: UpdateClusterRequest,
    request: Request,
    principal: Principal = Depends(current_principal),
) -> JSONResponse:
    """Rename; compute, type and container settings are fixed at creation."""
    state = app_state(request)
    number = clusters.cluster_number(id)
    scope = clusters.find_scope(state.ctx, principal, number)
    clusters.rename_cluster(state.ctx, principal, scope, number, body.name)
    seed = show_cluster(state.ctx, principal, scope, number, _partition(state))
    return answer(cluster_view(seed))


@router.delete("/clusters/{id}", status_code=204, responses=documented("Deleted", 204))
def delete_cluster(
    id: str, request: Request, principal: Principal = Depends(current_principal)
) -> Response:
    """Delete it and every node; billing ends now. Without a training operator
    (nothing was ever built) what it holds is released at once."""
    state = app_state(request)
    number = clusters.cluster_number(id)
    scope = clusters.find_scope(state.ctx, principal, number)
    training.delete_cluster(state.ctx, principal, scope, number, finish_now=state.training is None)
    return no_content()
