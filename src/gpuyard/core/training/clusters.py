"""Training clusters (seed 002): statuses, the nine actions (and our
``update_auto_terminate``) and what each needs.

Pure domain rules: which action is allowed in which status, which fields each action
requires and how they are validated, how nodes and their capacity holders are named.
The service layer applies them; the operator carries them out on the runtime.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from gpuyard.core.errors import InvalidState, ValidationFailed
from gpuyard.core.ownership import legacy_training_prefix

# What a controller (login) node reserves: it runs slurmctld and sshd, no GPUs.
CONTROLLER_VCPUS = 2
CONTROLLER_MEMORY_GB = 4
# Upper bound of workers per cluster (Slurm's MaxNodeCount for dynamic nodes).
MAX_WORKERS = 64


class TrainingStatus(StrEnum):
    CREATING = "creating"
    RUNNING = "running"
    UPDATING = "updating"
    RESTARTING = "restarting"
    SCALING = "scaling"
    DELETING = "deleting"
    DELETED = "deleted"
    ERROR = "error"
    # Stopped by the control plane (the account was suspended or its money ran out):
    # no node container runs and nothing is billed; the Slurm state volume, the network
    # and the cluster's settings are kept. restart_cluster brings it back.
    STOPPING = "stopping"
    STOPPED = "stopped"


_BUSY = (TrainingStatus.UPDATING, TrainingStatus.RESTARTING, TrainingStatus.SCALING)
# Every status change a training cluster may make. An operation (create, an action, a
# delete) starts from running (restart_cluster also from error or stopped) and ends in
# running or error; a delete supersedes whatever runs, and so does a stop (whatever
# holds nodes may be stopped: they are billed until then).
TRANSITIONS: dict[TrainingStatus, frozenset[TrainingStatus]] = {
    TrainingStatus.CREATING: frozenset(
        {
            TrainingStatus.RUNNING,
            TrainingStatus.ERROR,
            TrainingStatus.DELETING,
            TrainingStatus.STOPPING,
        }
    ),
    TrainingStatus.RUNNING: frozenset({*_BUSY, TrainingStatus.DELETING, TrainingStatus.STOPPING}),
    **{
        busy: frozenset(
            {
                TrainingStatus.RUNNING,
                TrainingStatus.ERROR,
                TrainingStatus.DELETING,
                TrainingStatus.STOPPING,
            }
        )
        for busy in _BUSY
    },
    TrainingStatus.ERROR: frozenset(
        {TrainingStatus.RESTARTING, TrainingStatus.DELETING, TrainingStatus.STOPPING}
    ),
    TrainingStatus.STOPPING: frozenset({TrainingStatus.STOPPED, TrainingStatus.DELETING}),
    TrainingStatus.STOPPED: frozenset({TrainingStatus.RESTARTING, TrainingStatus.DELETING}),
    TrainingStatus.DELETING: frozenset({TrainingStatus.DELETED}),
    TrainingStatus.DELETED: frozenset(),
}
# The statuses whose nodes hold capacity and are billed: those a stop applies to.
HOLDING = frozenset(s for s, targets in TRANSITIONS.items() if TrainingStatus.STOPPING in targets)
# The statuses whose nodes hold nothing (neither capacity nor quota).
AT_REST = frozenset({TrainingStatus.STOPPING, TrainingStatus.STOPPED})


def can_transition(current: TrainingStatus, target: TrainingStatus) -> bool:
    return target in TRANSITIONS[current]


class NodeRole(StrEnum):
    CONTROLLER = "controller"
    WORKER = "worker"


class NodeStatus(StrEnum):
    CREATING = "creating"
    RUNNING = "running"
    RESTARTING = "restarting"
    REPLACING = "replacing"
    ERROR = "error"
    STOPPED = "stopped"


class LifecycleStatus(StrEnum):
    """How a node's lifecycle script (run once per node container) went."""

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"


# Where the node image's entrypoint puts the lifecycle script's output and exit code:
# the contract between the image (runtimes/slurm/config.py) and the operator.
LIFECYCLE_LOG = "/var/log/gpuyard/lifecycle.log"
LIFECYCLE_RC = "/var/lib/gpuyard/lifecycle.rc"


class Action(StrEnum):
    UPDATE_SSH_KEYS = "update_ssh_keys"
    UPDATE_IMAGE = "update_image"
    RESTART_WORKERS = "restart_workers"
    RESTART_CLUSTER = "restart_cluster"
    SCALE_CLUSTER = "scale_cluster"
    ATTACH_IP = "attach_ip"
    DETACH_IP = "detach_ip"
    ADD_SECURITY_GROUP = "add_security_group"
    REMOVE_SECURITY_GROUP = "remove_security_group"
    # Not one of seed 002's nine: changes the auto-termination policy (an extension).
    UPDATE_AUTO_TERMINATE = "update_auto_terminate"


# Seed 002's table: the fields each action requires.
REQUIRED_FIELDS: dict[Action, tuple[str, ...]] = {
    Action.UPDATE_SSH_KEYS: ("ssh_key_ids",),
    Action.UPDATE_IMAGE: ("image_version_id",),
    Action.RESTART_WORKERS: (),
    Action.RESTART_CLUSTER: (),
    Action.SCALE_CLUSTER: ("additional_nodes",),
    Action.ATTACH_IP: ("reserved_ip_id",),
    Action.DETACH_IP: ("reserved_ip_id", "ip_type"),
    Action.ADD_SECURITY_GROUP: ("security_groups_ids",),
    Action.REMOVE_SECURITY_GROUP: ("security_group_id",),
    Action.UPDATE_AUTO_TERMINATE: ("auto_terminate",),
}

# Actions that run on the nodes go through a transitional status; the others change
# only the cluster's network edge and apply at once.
LONG_ACTIONS: dict[Action, TrainingStatus] = {
    Action.UPDATE_SSH_KEYS: TrainingStatus.UPDATING,
    Action.UPDATE_IMAGE: TrainingStatus.UPDATING,
    Action.RESTART_WORKERS: TrainingStatus.RESTARTING,
    Action.RESTART_CLUSTER: TrainingStatus.RESTARTING,
    Action.SCALE_CLUSTER: TrainingStatus.SCALING,
}

# restart_cluster is also how a cluster in error, or a stopped one, is brought back;
# the auto-termination policy may change whenever the cluster is not being deleted.
_ALLOWED_IN: dict[Action, frozenset[TrainingStatus]] = {
    action: frozenset({TrainingStatus.RUNNING}) for action in Action
} | {
    Action.RESTART_CLUSTER: frozenset(
        {TrainingStatus.RUNNING, TrainingStatus.ERROR, TrainingStatus.STOPPED}
    ),
    Action.UPDATE_AUTO_TERMINATE: frozenset(TrainingStatus)
    - {TrainingStatus.DELETING, TrainingStatus.DELETED},
}

IP_TYPES = ("public", "reserved")


def allowed_actions(status: TrainingStatus) -> list[str]:
    return [a.value for a in Action if status in _ALLOWED_IN[a]]


def parse_action(body: dict[str, Any]) -> Action:
    raw = body.get("action")
    if raw is None or raw == "":
        raise ValidationFailed("action", "is required", {"allowed": [a.value for a in Action]})
    try:
        return Action(raw)
    except ValueError as exc:
        raise ValidationFailed(
            "action", f"unknown action {raw!r}", {"allowed": [a.value for a in Action]}
        ) from exc


def check_allowed(action: Action, status: TrainingStatus) -> None:
    """Raises InvalidState naming the status when ``action`` cannot run now."""
    if status not in _ALLOWED_IN[action]:
        raise InvalidState(
            f"cannot {action.value} a cluster in status '{status.value}'",
            {"status": status.value, "allowed_actions": allowed_actions(status)},
        )


def require_fields(action: Action, body: dict[str, Any]) -> None:
    known = {"action", *REQUIRED_FIELDS[action]}
    for field in REQUIRED_FIELDS[action]:
        if body.get(field) is None:
            raise ValidationFailed(field, f"is required for action {action.value}")
    for field in body:
        if field not in known:
            raise ValidationFailed(field, f"is not a field of action {action.value}")


def positive_int(field: str, value: object, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationFailed(field, f"must be an integer, got {value!r}")
    if value < 1:
        raise ValidationFailed(field, "must be at least 1")
    if maximum is not None and value > maximum:
        raise ValidationFailed(field, f"must be at most {maximum}")
    return value


def parse_ip_type(value: object) -> str:
    if value not in IP_TYPES:
        raise ValidationFailed("ip_type", f"must be one of {', '.join(IP_TYPES)}")
    return str(value)


@dataclass(frozen=True)
class NodeName:
    """Names of a cluster's nodes: container name, hostname and Slurm NodeName at
    once, so they are DNS labels (lowercase letters, digits, dashes)."""

    cluster_id: int
    # The cluster's stored prefix (Ownership.training_prefix); None: a cluster made
    # before installation ids, whose names keep the old form.
    stored_prefix: str | None = None

    @property
    def prefix(self) -> str:
        return self.stored_prefix or legacy_training_prefix(self.cluster_id)

    @property
    def controller(self) -> str:
        return f"{self.prefix}-controller"

    def worker(self, index: int) -> str:
        return f"{self.prefix}-worker-{index}"

    @property
    def network(self) -> str:
        return f"{self.prefix}-net"

    @property
    def state_volume(self) -> str:
        return f"{self.prefix}-slurmstate"


def node_owner(node_id: int) -> str:
    """The holder id a node's GPUs and reservation are recorded under (the capacity
    tables hold cluster ids and these; ``tn-`` never collides with a cluster id,
    which has no dash)."""
    return f"tn-{node_id}"


def cluster_owner(cluster_id: int) -> str:
    """The holder id of a training cluster's own ports (its SSH entry)."""
    return f"tc-{cluster_id}"
