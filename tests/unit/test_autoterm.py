from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gpuyard.core.autoterm import Rule, deadlines, parse_policy
from gpuyard.core.models import AutoTerminatePolicy

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def test_parse_policy_needs_enabled_and_a_rule() -> None:
    assert parse_policy(None) is None
    assert parse_policy({"enabled": False, "max_runtime_hours": 1}) is None
    assert parse_policy({"enabled": True}) is None
    policy = parse_policy({"enabled": True, "idle_minutes": 30})
    assert policy is not None and policy.action == "stop"


def test_deadlines_earliest_first_and_reasons() -> None:
    policy = AutoTerminatePolicy(
        enabled=True, max_runtime_hours=2, cost_limit_usd=5, idle_minutes=30, action="terminate"
    )
    plan = deadlines(policy, run_started_at=T0, hourly_rate=10.0, idle_since=T0)
    assert [d.rule for d in plan] == [Rule.COST_LIMIT, Rule.IDLE, Rule.MAX_RUNTIME]
    assert plan[0].at == T0 + timedelta(minutes=30) and plan[2].at == T0 + timedelta(hours=2)
    reason = plan[0].reason(
        run_started_at=T0, fired_at=T0 + timedelta(minutes=30, seconds=0.432), rate=10.0,
        policy=policy,
    )  # fmt: skip
    assert reason == "auto-terminated: cost limit 5.00 USD reached at 5.0012 USD"


def test_no_rate_no_cost_deadline_and_busy_means_no_idle_deadline() -> None:
    policy = AutoTerminatePolicy(enabled=True, cost_limit_usd=5, idle_minutes=10)
    assert deadlines(policy, run_started_at=T0, hourly_rate=0.0, idle_since=None) == []
