"""Typed inputs of the training-cluster use cases, parsed from seed 002's JSON bodies.

``parse_cluster_spec`` (``POST /distributed_jobs_v2/cluster/``) and
``parse_action_request`` (``PUT .../{id}/``) check everything that can be judged from
the body alone and raise ValidationFailed naming the field, with the messages the API
has always given. What needs the store (does the image, key, plan, GPU type, reserved
IP or group exist, is it this account's, does a scale fit under the cap) is checked by
services/training/use_cases.py, so a body with several faults names one seen in the body first.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from gpuyard.core.errors import ValidationFailed
from gpuyard.core.input_rules import check_name
from gpuyard.core.models import TrainingAutoTerminatePolicy
from gpuyard.core.training import clusters as domain
from gpuyard.core.training.clusters import Action
from gpuyard.services.access.resource_util import id_list, one_id
from gpuyard.services.clusters.autoterm_policy import merge_policy, parse_update
from gpuyard.services.clusters.requests import TrainingAutoTerminateUpdate

CREATE_FIELDS = frozenset(
    {
        "name",
        "image_version_id",
        "ssh_key_ids",
        "no_of_nodes",
        "sku_id",
        "gpu_type",
        "gpus_per_node",
        "cpus_per_node",
        "memory_gb_per_node",
        "security_group_id",
        "lifecycle_script",
        "auto_terminate",
    }
)
MAX_NAME_CHARS = 100
MAX_SCRIPT_BYTES = 64 * 1024
_CUSTOM_PLAN_FIELDS = ("gpu_type", "gpus_per_node", "cpus_per_node", "memory_gb_per_node")


@dataclass(frozen=True)
class PlanById:
    """A plan from ``GET /v1/plans`` (``sku_id``); whether it exists is the store's."""

    sku_id: int


@dataclass(frozen=True)
class CustomPlan:
    """A plan given field by field; ``gpu_type`` as the caller named it (an id or a
    display name), resolved against the catalog by the service."""

    gpu_type: str
    gpus_per_node: int
    cpus_per_node: int
    memory_gb_per_node: int


PlanChoice = PlanById | CustomPlan


@dataclass(frozen=True)
class ClusterSpec:
    """A validated create body. Ids are well-formed, not yet known to exist."""

    name: str
    image_version_id: int
    ssh_key_ids: tuple[int, ...]
    no_of_nodes: int
    plan: PlanChoice
    security_group_id: int | None = None
    lifecycle_script: str | None = None
    # The auto-termination policy as stored (validated; enabled unless sent false);
    # None: none.
    auto_terminate: dict[str, object] | None = None


def _name(body: Mapping[str, object]) -> str:
    value = body.get("name")
    if not isinstance(value, str) or not value.strip():
        raise ValidationFailed("name", "is required and must be a non-empty string")
    if len(value) > MAX_NAME_CHARS:
        raise ValidationFailed("name", f"must be at most {MAX_NAME_CHARS} characters")
    try:
        check_name(value)
    except ValueError as exc:
        raise ValidationFailed("name", str(exc)) from None
    return value.strip()


def _image_id(value: object) -> int:
    if value is None:
        raise ValidationFailed("image_version_id", "is required")
    return one_id(value, "image_version_id", "image version")


def _plan(body: Mapping[str, object]) -> PlanChoice:
    given = [f for f in _CUSTOM_PLAN_FIELDS if body.get(f) is not None]
    sku_id = body.get("sku_id")
    if sku_id is not None:
        if given:
            raise ValidationFailed(given[0], "give either sku_id or a custom plan, not both")
        if isinstance(sku_id, bool) or not isinstance(sku_id, int):
            raise ValidationFailed("sku_id", "must be an integer plan id (GET /v1/plans)")
        return PlanById(sku_id)
    if not given:
        raise ValidationFailed(
            "sku_id", "a plan is required: sku_id, or gpu_type with gpus/cpus/memory per node"
        )
    for field in _CUSTOM_PLAN_FIELDS:
        if body.get(field) is None:
            raise ValidationFailed(field, "is required for a custom plan")
    gpu_type = body["gpu_type"]
    if not isinstance(gpu_type, str):
        raise ValidationFailed("gpu_type", f"unknown GPU type {gpu_type!r} (GET /v1/gpu-types)")
    return CustomPlan(
        gpu_type,
        domain.positive_int("gpus_per_node", body["gpus_per_node"], 16),
        domain.positive_int("cpus_per_node", body["cpus_per_node"], 512),
        domain.positive_int("memory_gb_per_node", body["memory_gb_per_node"], 4096),
    )


def _script(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValidationFailed("lifecycle_script", "must be a string (a shell script)")
    if len(value.encode()) > MAX_SCRIPT_BYTES:
        raise ValidationFailed("lifecycle_script", f"must be at most {MAX_SCRIPT_BYTES} bytes")
    return value or None  # an empty script is no script


def _policy(value: object) -> dict[str, object] | None:
    """The create body's ``auto_terminate``, as stored: the fields sent over an empty
    policy (enabled and ``stop`` unless sent otherwise), bounds as for clusters."""
    if value is None:
        return None
    update = parse_update(value, TrainingAutoTerminateUpdate, "auto_terminate")
    return merge_policy({}, update, "auto_terminate.", TrainingAutoTerminatePolicy)


def parse_cluster_spec(body: Mapping[str, object]) -> ClusterSpec:
    """The create body, checked field by field in a fixed order (unknown fields first,
    then name, image, keys, node count, plan, security group, script, policy). Raises
    ValidationFailed naming the first bad field."""
    for field in body:
        if field not in CREATE_FIELDS:
            raise ValidationFailed(field, "unknown field", {"allowed": sorted(CREATE_FIELDS)})
    name = _name(body)
    image_version_id = _image_id(body.get("image_version_id"))
    keys = id_list(body.get("ssh_key_ids"), "ssh_key_ids", "SSH key")
    workers = domain.positive_int("no_of_nodes", body.get("no_of_nodes"), domain.MAX_WORKERS)
    plan = _plan(body)
    group = body.get("security_group_id")
    group_id = None if group is None else id_list([group], "security_group_id", "security group")[0]
    return ClusterSpec(
        name=name,
        image_version_id=image_version_id,
        ssh_key_ids=tuple(keys),
        no_of_nodes=workers,
        plan=plan,
        security_group_id=group_id,
        lifecycle_script=_script(body.get("lifecycle_script")),
        auto_terminate=_policy(body.get("auto_terminate")),
    )


# ---------------------------------------------------------------- actions


@dataclass(frozen=True)
class UpdateSshKeys:
    action: ClassVar[Action] = Action.UPDATE_SSH_KEYS
    ssh_key_ids: tuple[int, ...]


@dataclass(frozen=True)
class UpdateImage:
    action: ClassVar[Action] = Action.UPDATE_IMAGE
    image_version_id: int


@dataclass(frozen=True)
class RestartWorkers:
    action: ClassVar[Action] = Action.RESTART_WORKERS


@dataclass(frozen=True)
class RestartCluster:
    action: ClassVar[Action] = Action.RESTART_CLUSTER


@dataclass(frozen=True)
class ScaleCluster:
    """``additional_nodes`` is at least 1; the cap depends on the cluster's workers."""

    action: ClassVar[Action] = Action.SCALE_CLUSTER
    additional_nodes: int


@dataclass(frozen=True)
class AttachIp:
    action: ClassVar[Action] = Action.ATTACH_IP
    reserved_ip_id: int


@dataclass(frozen=True)
class DetachIp:
    action: ClassVar[Action] = Action.DETACH_IP
    reserved_ip_id: int
    ip_type: str


@dataclass(frozen=True)
class AddSecurityGroups:
    action: ClassVar[Action] = Action.ADD_SECURITY_GROUP
    security_group_ids: tuple[int, ...]


@dataclass(frozen=True)
class RemoveSecurityGroup:
    action: ClassVar[Action] = Action.REMOVE_SECURITY_GROUP
    security_group_id: int


@dataclass(frozen=True)
class UpdateAutoTerminate:
    """Changes to the policy: only the fields sent apply (null removes a rule)."""

    action: ClassVar[Action] = Action.UPDATE_AUTO_TERMINATE
    update: TrainingAutoTerminateUpdate


ActionRequest = (
    UpdateSshKeys
    | UpdateImage
    | RestartWorkers
    | RestartCluster
    | ScaleCluster
    | AttachIp
    | DetachIp
    | AddSecurityGroups
    | RemoveSecurityGroup
    | UpdateAutoTerminate
)


def _remove_group_id(raw: object) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise ValidationFailed("security_group_id", f"must be an integer id, got {raw!r}")
    return raw


def parse_action_request(body: Mapping[str, object]) -> ActionRequest:
    """One of seed 002's actions: ``action`` known, its required fields present and no
    others (core/training/clusters.py), then each field well-formed. Raises ValidationFailed
    naming the field."""
    action = domain.parse_action(dict(body))
    domain.require_fields(action, dict(body))
    match action:
        case Action.UPDATE_SSH_KEYS:
            keys = id_list(body["ssh_key_ids"], "ssh_key_ids", "SSH key")
            return UpdateSshKeys(tuple(keys))
        case Action.UPDATE_IMAGE:
            return UpdateImage(_image_id(body["image_version_id"]))
        case Action.RESTART_WORKERS:
            return RestartWorkers()
        case Action.RESTART_CLUSTER:
            return RestartCluster()
        case Action.SCALE_CLUSTER:
            return ScaleCluster(domain.positive_int("additional_nodes", body["additional_nodes"]))
        case Action.ATTACH_IP:
            return AttachIp(one_id(body["reserved_ip_id"], "reserved_ip_id", "reserved IP"))
        case Action.DETACH_IP:
            ip_type = domain.parse_ip_type(body["ip_type"])
            return DetachIp(
                one_id(body["reserved_ip_id"], "reserved_ip_id", "reserved IP"), ip_type
            )
        case Action.ADD_SECURITY_GROUP:
            groups = id_list(body["security_groups_ids"], "security_groups_ids", "security group")
            return AddSecurityGroups(tuple(groups))
        case Action.REMOVE_SECURITY_GROUP:
            return RemoveSecurityGroup(_remove_group_id(body["security_group_id"]))
        case Action.UPDATE_AUTO_TERMINATE:
            update = parse_update(
                body["auto_terminate"], TrainingAutoTerminateUpdate, "auto_terminate"
            )
            return UpdateAutoTerminate(update)
