"""Stored policies as readers see them, and updates merged over them."""

from __future__ import annotations

import json
import math

import pytest

from gpuyard.core.autoterm import read_policy, shown_policy
from gpuyard.core.errors import ValidationFailed
from gpuyard.services.clusters.autoterm_policy import merge_policy
from gpuyard.services.clusters.requests import AutoTerminateUpdate


def test_read_policy_says_why_a_stored_policy_is_not_enforced() -> None:
    assert read_policy({"enabled": True, "idle_minutes": 30}).error is None
    assert read_policy({"enabled": False, "cost_limit_usd": 1e300}).error is None  # off
    assert read_policy({}).policy is None and read_policy({}).error is None
    null_action = read_policy({"enabled": True, "max_runtime_hours": 1, "action": None})
    assert null_action.policy is None
    assert null_action.error is not None and null_action.error.startswith("action: ")
    huge = read_policy({"enabled": True, "cost_limit_usd": 1e300}).error
    assert huge is not None and "at most 1,000,000" in huge
    assert read_policy("garbage").error == "the stored policy is a JSON str, not an object"


def test_shown_policy_is_always_strict_json() -> None:
    shown = shown_policy({"enabled": True, "cost_limit_usd": math.inf, "idle_minutes": math.nan})
    assert shown == {"enabled": True, "cost_limit_usd": "Infinity", "idle_minutes": "NaN"}
    json.dumps(shown, allow_nan=False)
    assert shown_policy([1]) == {"enabled": False, "stored": [1]}
    assert shown_policy({}) == {"enabled": False}


def _update(**fields: object) -> AutoTerminateUpdate:
    return AutoTerminateUpdate.model_validate(fields)


def test_merge_validates_the_whole_policy_and_names_a_bad_stored_value() -> None:
    stored = {"enabled": True, "max_runtime_hours": 1, "action": None}
    with pytest.raises(ValidationFailed) as exc:
        merge_policy(stored, _update(idle_minutes=30))
    assert exc.value.field == "action"
    assert "the stored value null is not valid" in exc.value.message
    fixed = merge_policy(stored, _update(action="terminate"))
    assert fixed["action"] == "terminate" and fixed["max_runtime_hours"] == 1
    with pytest.raises(ValidationFailed) as huge:
        merge_policy(
            {"enabled": True, "cost_limit_usd": 1e300}, _update(), "auto_terminate_updates."
        )
    assert huge.value.field == "auto_terminate_updates.cost_limit_usd"
    cleared = merge_policy({"enabled": True, "cost_limit_usd": 1e300}, _update(cost_limit_usd=None))
    assert cleared["cost_limit_usd"] is None and cleared["enabled"] is True


def test_merge_keeps_the_old_semantics() -> None:
    merged = merge_policy({"enabled": False, "idle_minutes": 5, "junk": 1}, _update(action="stop"))
    assert merged == {
        "enabled": False,
        "idle_minutes": 5,
        "cost_limit_usd": None,
        "max_runtime_hours": None,
        "action": "stop",
    }
    assert merge_policy({}, _update(max_runtime_hours=2))["enabled"] is True


@pytest.mark.parametrize(
    "fields",
    [{"action": None}, {"enabled": None}, {"cost_limit_usd": 1e300}, {"idle_minutes": True}],
)
def test_an_update_refuses_null_action_and_unbounded_values(fields: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        AutoTerminateUpdate.model_validate(fields)
