"""Cluster statuses, the allowed-transition table and the actions a user may take.

``transition_cluster`` (services/clusters/lifecycle.py) is the only writer of a status and
checks every change against :data:`TRANSITIONS`.
"""

from __future__ import annotations

from enum import StrEnum


class ClusterStatus(StrEnum):
    PENDING = "pending"
    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"
    TERMINATING = "terminating"
    TERMINATED = "terminated"
    ERROR = "error"


class Action(StrEnum):
    START = "start"
    STOP = "stop"
    RESTART = "restart"
    TERMINATE = "terminate"


S = ClusterStatus

TRANSITIONS: dict[ClusterStatus, frozenset[ClusterStatus]] = {
    S.PENDING: frozenset({S.STARTING, S.STOPPING, S.TERMINATING, S.ERROR}),
    # starting -> starting is a retry of the startup phases (restart, crash recovery)
    S.STARTING: frozenset({S.STARTING, S.RUNNING, S.STOPPING, S.TERMINATING, S.ERROR}),
    S.RUNNING: frozenset({S.STARTING, S.STOPPING, S.TERMINATING, S.ERROR}),
    S.STOPPING: frozenset({S.STOPPED, S.TERMINATING, S.ERROR}),
    S.STOPPED: frozenset({S.STARTING, S.TERMINATING}),
    S.ERROR: frozenset({S.STARTING, S.STOPPING, S.TERMINATING}),
    S.TERMINATING: frozenset({S.TERMINATED, S.ERROR}),
    S.TERMINATED: frozenset(),
}

ALLOWED_ACTIONS: dict[ClusterStatus, tuple[Action, ...]] = {
    S.PENDING: (Action.STOP, Action.TERMINATE),
    S.STARTING: (Action.STOP, Action.TERMINATE),
    S.RUNNING: (Action.STOP, Action.RESTART, Action.TERMINATE),
    # A start while stopping is recorded and made once the stop is done.
    S.STOPPING: (Action.START, Action.TERMINATE),
    S.STOPPED: (Action.START, Action.TERMINATE),
    S.ERROR: (Action.START, Action.STOP, Action.TERMINATE),
    S.TERMINATING: (),
    S.TERMINATED: (),
}

# Statuses in which a cluster holds GPUs, vCPUs and memory on its host.
HOLDS_COMPUTE: frozenset[ClusterStatus] = frozenset({S.PENDING, S.STARTING, S.RUNNING, S.STOPPING})

# Statuses the reconciler must drive toward a resting status.
IN_MOTION: frozenset[ClusterStatus] = frozenset({S.PENDING, S.STARTING, S.STOPPING, S.TERMINATING})

# Statuses in which a cluster may legitimately have a container; in any other, a
# container labelled with its id is an orphan.
# An ``error`` cluster keeps its stopped container, so its logs can be read.
MAY_HAVE_CONTAINER: frozenset[ClusterStatus] = IN_MOTION | {S.RUNNING, S.ERROR}

# What status each action requires, for the INVALID_STATE details.
REQUIRED_STATUS: dict[Action, str] = {
    Action.START: "stopped",
    Action.STOP: "running",
    Action.RESTART: "running",
    Action.TERMINATE: "any status but terminating or terminated",
}

SUGGESTIONS: dict[Action, str] = {
    Action.START: "Stop the cluster first or wait for it to finish current operations",
    Action.STOP: "Start the cluster first or wait for it to finish current operations",
    Action.RESTART: "Start the cluster first or wait for it to finish current operations",
    Action.TERMINATE: "The cluster is already being terminated",
}


def can_transition(current: ClusterStatus, target: ClusterStatus) -> bool:
    return target in TRANSITIONS[current]


def allowed_actions(status: ClusterStatus) -> tuple[Action, ...]:
    return ALLOWED_ACTIONS[status]
