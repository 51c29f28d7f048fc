"""Auto-termination rules, pure: when each rule of a cluster's policy fires next.

Deadlines are computed, never polled for: the run's start plus its maximum runtime;
the moment the run's cost reaches the limit at the run's (constant) hourly rate; the
moment the cluster will have been idle long enough. The reconciler sleeps until the
earliest one.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from gpuyard.core.models import AutoTerminatePolicy


class Rule(StrEnum):
    MAX_RUNTIME = "max_runtime"
    COST_LIMIT = "cost_limit"
    IDLE = "idle"


@dataclass(frozen=True)
class Deadline:
    at: datetime
    rule: Rule
    action: str  # "stop" | "terminate"

    def reason(
        self,
        *,
        run_started_at: datetime,
        fired_at: datetime,
        rate: float,
        policy: AutoTerminatePolicy,
    ) -> str:
        """What the event log and lastStatusChange say when this deadline fires."""
        hours = (fired_at - run_started_at).total_seconds() / 3600
        verb = "terminated" if self.action == "terminate" else "stopped"
        if self.rule == Rule.COST_LIMIT:
            spent = hours * rate
            return (
                f"auto-{verb}: cost limit {policy.cost_limit_usd:.2f} USD reached at "
                f"{spent:.4f} USD"
            )
        if self.rule == Rule.MAX_RUNTIME:
            return (
                f"auto-{verb}: max runtime {policy.max_runtime_hours:g} h reached at {hours:.4f} h"
            )
        return f"auto-{verb}: idle for {policy.idle_minutes:g} min"


def parse_policy(raw: dict[str, Any] | None) -> AutoTerminatePolicy | None:
    """The stored policy when it is enabled and has at least one rule, else None."""
    if not raw or not raw.get("enabled"):
        return None
    policy = AutoTerminatePolicy.model_validate(raw)
    if (
        policy.max_runtime_hours is None
        and policy.cost_limit_usd is None
        and not (policy.idle_minutes)
    ):
        return None
    return policy


def deadlines(
    policy: AutoTerminatePolicy,
    *,
    run_started_at: datetime,
    hourly_rate: float,
    idle_since: datetime | None,
) -> list[Deadline]:
    """Every rule's deadline, earliest first. ``idle_since`` is None while the cluster
    is busy (or not yet sampled); a zero rate never reaches a cost limit."""
    out: list[Deadline] = []
    if policy.max_runtime_hours is not None:
        out.append(
            Deadline(
                run_started_at + timedelta(hours=policy.max_runtime_hours),
                Rule.MAX_RUNTIME,
                policy.action,
            )
        )
    if policy.cost_limit_usd is not None and hourly_rate > 0:
        hours = policy.cost_limit_usd / hourly_rate
        out.append(
            Deadline(run_started_at + timedelta(hours=hours), Rule.COST_LIMIT, policy.action)
        )
    if policy.idle_minutes and idle_since is not None:
        out.append(
            Deadline(idle_since + timedelta(minutes=policy.idle_minutes), Rule.IDLE, policy.action)
        )
    return sorted(out, key=lambda d: d.at)


def run_started_at(
    start_initiated_at: datetime | None, started_at: datetime | None, created_at: datetime
) -> datetime:
    """The current run began when its start was requested (billing starts there too)."""
    return start_initiated_at or started_at or created_at
