from __future__ import annotations

import pytest
from pydantic import ValidationError

from gpuyard.core.billing.pricing import Prices, hourly_rate
from gpuyard.core.catalog import SEED_GPU_TYPES
from gpuyard.core.errors import ValidationFailed
from gpuyard.core.models import CloudType, PortSpec
from gpuyard.core.progress import TOTAL_STEPS, progress_for
from gpuyard.core.states import TRANSITIONS, Action, ClusterStatus, allowed_actions, can_transition
from gpuyard.core.text import nul_path
from gpuyard.core.training import clusters as training_rules
from gpuyard.services.clusters.requests import CreateCluster, StartCluster
from gpuyard.services.fleet.discovery import parse_declared_gpus


def test_transition_table_is_closed_and_terminal_is_final() -> None:
    assert set(TRANSITIONS) == set(ClusterStatus)
    assert not TRANSITIONS[ClusterStatus.TERMINATED]
    for status in ClusterStatus:
        if status not in (ClusterStatus.TERMINATING, ClusterStatus.TERMINATED):
            assert can_transition(status, ClusterStatus.TERMINATING)
    assert not can_transition(ClusterStatus.STOPPED, ClusterStatus.RUNNING)


def test_actions_per_status() -> None:
    assert allowed_actions(ClusterStatus.RUNNING) == (Action.STOP, Action.RESTART, Action.TERMINATE)
    assert allowed_actions(ClusterStatus.STOPPED) == (Action.START, Action.TERMINATE)
    # A start while stopping is recorded and made once the stop is done.
    assert allowed_actions(ClusterStatus.STOPPING) == (Action.START, Action.TERMINATE)
    assert allowed_actions(ClusterStatus.TERMINATED) == ()


def test_progress_only_grows_and_ends_ready() -> None:
    values = [progress_for(i) for i in range(TOTAL_STEPS + 1)]
    percentages = [p.percentage for p in values]
    assert percentages == sorted(percentages) and percentages[-1] == 100
    assert values[2].current_step == "Restoring snapshot" or values[2].steps_completed == 2
    assert values[-1].phase == "ready" and values[0].total_steps == 8


def test_rates_running_and_stopped() -> None:
    a6000 = next(g for g in SEED_GPU_TYPES if g.id == "NVIDIA RTX A6000")
    kw = {
        "gpu": a6000,
        "gpu_count": 2,
        "cpu_cores": 4,
        "memory_gb": 16,
        "container_disk_gb": 73,
        "volume_gb": 73,
        "cloud_type": CloudType.SECURE,
        "prices": Prices(),
    }
    running = hourly_rate(running=True, **kw)  # type: ignore[arg-type]
    stopped = hourly_rate(running=False, **kw)  # type: ignore[arg-type]
    assert running.gpu == pytest.approx(1.52)
    assert running.container_disk == pytest.approx(0.01) and running.volume == pytest.approx(0.01)
    assert (
        stopped.gpu == 0 and stopped.container_disk == 0 and stopped.volume == pytest.approx(0.02)
    )
    community = hourly_rate(running=True, **{**kw, "cloud_type": CloudType.COMMUNITY})  # type: ignore[arg-type]
    assert community.gpu == pytest.approx(0.66)


def test_declared_gpus_parse() -> None:
    gpus = parse_declared_gpus("NVIDIA RTX A6000:2, NVIDIA GeForce RTX 4090:1")
    assert [(g.index, g.gpu_type) for g in gpus] == [
        (0, "NVIDIA RTX A6000"),
        (1, "NVIDIA RTX A6000"),
        (2, "NVIDIA GeForce RTX 4090"),
    ]
    with pytest.raises(ValidationFailed):
        parse_declared_gpus("A6000")


def test_request_validation() -> None:
    with pytest.raises(ValidationError):
        CreateCluster.model_validate({"docker_image": "x", "env": {"BAD-NAME": "1"}})
    with pytest.raises(ValidationError):
        PortSpec.model_validate({"internal_port": 0})
    with pytest.raises(ValidationError):
        StartCluster.model_validate({"timeout_minutes": 31})
    assert StartCluster.model_validate({}).timeout_minutes == 10


def test_training_transitions() -> None:
    t = training_rules.TrainingStatus
    allowed = training_rules.can_transition
    assert allowed(t.CREATING, t.RUNNING) and allowed(t.ERROR, t.RESTARTING)
    assert allowed(t.SCALING, t.DELETING) and allowed(t.DELETING, t.DELETED)
    # An operation starts only from running (or error for a restart); deleted is final.
    assert not allowed(t.UPDATING, t.SCALING)
    assert not allowed(t.ERROR, t.UPDATING)
    assert not allowed(t.DELETING, t.RUNNING)
    assert not any(allowed(t.DELETED, other) for other in t)


def test_nul_path_names_where_a_nul_is() -> None:
    assert nul_path({"a": [1, "ok", {"b": "x\x00"}]}) == "a[2].b"
    assert nul_path({"k\x00": 1}) == "k\\u0000"
    assert nul_path("\x00") == ""
    assert nul_path({"a": ["fine"], "n": None, "f": 1.5}) is None
    deep: object = "\x00"
    for _ in range(5000):  # deeper than Python's recursion limit
        deep = [deep]
    assert nul_path(deep) == "[0]" * 5000
