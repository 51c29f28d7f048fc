"""Every auto-termination value is bounded, and no deadline computation overflows."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from gpuyard.core.autoterm import Rule, deadlines, parse_policy
from gpuyard.core.models import AutoTerminatePolicy

T0 = datetime(2026, 1, 1, tzinfo=UTC)
LIMITS = {"idle_minutes": 525_600, "max_runtime_hours": 8_760, "cost_limit_usd": 1_000_000}


@pytest.mark.parametrize("field", sorted(LIMITS))
@pytest.mark.parametrize(
    "value", [1e300, math.inf, -math.inf, math.nan, 0, -1, True, False, "5", [], {}]
)
def test_out_of_bounds_values_are_refused_naming_the_bounds(field: str, value: Any) -> None:
    with pytest.raises(ValidationError) as exc:
        AutoTerminatePolicy.model_validate({"enabled": True, field: value})
    error = exc.value.errors()[0]
    assert error["loc"] == (field,)
    assert f"at most {LIMITS[field]:,}" in error["msg"] and "greater than 0" in error["msg"]


@pytest.mark.parametrize("field", sorted(LIMITS))
def test_values_inside_the_bounds_are_kept(field: str) -> None:
    for value in (0.05, 1, LIMITS[field]):
        policy = AutoTerminatePolicy.model_validate({"enabled": True, field: value})
        assert getattr(policy, field) == value
    with pytest.raises(ValidationError):
        AutoTerminatePolicy.model_validate({"enabled": True, field: LIMITS[field] * 1.000001})


@pytest.mark.parametrize("action", [None, "", "STOP", "delete", 1])
def test_action_is_stop_or_terminate_and_never_null(action: object) -> None:
    with pytest.raises(ValidationError) as exc:
        AutoTerminatePolicy.model_validate({"enabled": True, "action": action})
    assert exc.value.errors()[0]["loc"] == ("action",)


@pytest.mark.parametrize("enabled", [None, "yes", 1])
def test_enabled_is_a_boolean(enabled: object) -> None:
    with pytest.raises(ValidationError):
        AutoTerminatePolicy.model_validate({"enabled": enabled, "idle_minutes": 5})


def _unchecked(**values: Any) -> AutoTerminatePolicy:
    """A policy as a row stored before the bounds held it (validation bypassed)."""
    base: dict[str, Any] = {
        "enabled": True,
        "idle_minutes": None,
        "cost_limit_usd": None,
        "max_runtime_hours": None,
        "action": "stop",
    }
    return AutoTerminatePolicy.model_construct(**{**base, **values})


def test_a_cost_limit_beyond_the_horizon_is_never_not_an_overflow() -> None:
    policy = _unchecked(cost_limit_usd=1e300, max_runtime_hours=2.0)
    plan = deadlines(policy, run_started_at=T0, hourly_rate=0.76, idle_since=None)
    assert [(d.rule, d.at) for d in plan] == [(Rule.MAX_RUNTIME, T0 + timedelta(hours=2))]
    # A tiny rate makes even a small limit astronomically far.
    tiny = _unchecked(cost_limit_usd=5.0)
    assert deadlines(tiny, run_started_at=T0, hourly_rate=1e-300, idle_since=None) == []


def test_no_rule_overflows_near_the_end_of_the_calendar() -> None:
    late = datetime.max.replace(tzinfo=UTC) - timedelta(hours=1)
    policy = _unchecked(max_runtime_hours=8760.0, cost_limit_usd=1e6, idle_minutes=1e300)
    assert deadlines(policy, run_started_at=late, hourly_rate=0.01, idle_since=late) == []
    nan = _unchecked(max_runtime_hours=math.nan, idle_minutes=math.inf)
    assert deadlines(nan, run_started_at=T0, hourly_rate=1.0, idle_since=T0) == []


@pytest.mark.parametrize(
    "raw",
    [
        {"enabled": True, "cost_limit_usd": 1e300},
        {"enabled": True, "max_runtime_hours": 1, "action": None},
        {"enabled": True, "idle_minutes": math.nan},
        {"enabled": True, "idle_minutes": "soon"},
        {"enabled": True, "max_runtime_hours": 1, "surprise": 1},
        "garbage",
        [1, 2],
        42,
    ],
)
def test_a_stored_policy_that_does_not_validate_is_not_enforced_and_never_raises(
    raw: object,
) -> None:
    assert parse_policy(raw) is None
