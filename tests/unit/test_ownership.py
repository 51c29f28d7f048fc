"""Installation identity (names and labels) and the restart policy: pure logic."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gpuyard.core.ownership import (
    LABEL_INSTALLATION,
    LABEL_MANAGED,
    Ownership,
    legacy_container_name,
)
from gpuyard.core.restarts import RestartPolicy, judge_failure
from gpuyard.core.training.clusters import NodeName
from gpuyard.runtimes.engines.engine import Engine

OWNER = Ownership("1a2b3c4d-0000-4000-8000-000000000001")
OTHER = Ownership("9f8e7d6c-0000-4000-8000-000000000002")


def test_names_carry_the_installation_and_never_collide() -> None:
    assert OWNER.container("abc") == "gy1a2b3c4d-abc"
    assert OWNER.volume("abc") == "gy1a2b3c4d-vol-abc"
    assert OWNER.container("abc") != OTHER.container("abc")
    names = NodeName(7, OWNER.training_prefix(7))
    assert names.controller == "gy1a2b3c4d-tc7-controller"
    assert names.network == "gy1a2b3c4d-tc7-net"
    assert names.state_volume == "gy1a2b3c4d-tc7-slurmstate"
    assert NodeName(7).controller == "gy-tc7-controller"  # made before installation ids
    assert len(NodeName(10**9, OWNER.training_prefix(10**9)).worker(999)) <= 63


def test_labels_and_ownership() -> None:
    labels = OWNER.labels()
    assert labels == {LABEL_MANAGED: "true", LABEL_INSTALLATION: OWNER.installation_id}
    assert OWNER.owns(labels) and not OTHER.owns(labels)
    assert not OWNER.owns({LABEL_MANAGED: "true"}) and not OWNER.owns(None)
    with pytest.raises(ValueError):
        Ownership("not-a-uuid")


def test_engine_claims_only_ours_and_known_legacy_objects() -> None:
    engine = Engine("unix:///nowhere.sock", owner=OWNER)
    assert engine.claims(OWNER.labels())
    assert not engine.claims(OTHER.labels())
    assert not engine.claims(OTHER.labels(), legacy=True)
    assert not engine.claims({"app": "mine"}, legacy=True)
    assert not engine.claims({LABEL_MANAGED: "true"})
    assert engine.claims({LABEL_MANAGED: "true"}, legacy=True)
    assert legacy_container_name("abc") == "gpuyard-abc"
    with pytest.raises(ValueError):
        engine.bind(OTHER)
    engine.bind(OWNER)  # the same owner again: fine


def test_restart_backoff_doubles_caps_and_gives_up_within_the_window() -> None:
    policy = RestartPolicy(initial_s=1, max_s=300, limit=5, window_s=600)
    assert [policy.delay(n) for n in range(1, 12)] == [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300]
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    failures: tuple[datetime, ...] = ()
    for i in range(4):
        verdict = judge_failure(policy, failures, t0 + timedelta(seconds=i))
        assert not verdict.give_up
        failures = verdict.failures
    assert judge_failure(policy, failures, t0 + timedelta(seconds=4)).give_up
    late = judge_failure(policy, failures, t0 + timedelta(seconds=700))
    assert not late.give_up and len(late.failures) == 1
    assert late.retry_at == t0 + timedelta(seconds=701)
