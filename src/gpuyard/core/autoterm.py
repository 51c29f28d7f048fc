"""Auto-termination rules, pure: when each rule of a cluster's policy fires next.

Deadlines are computed, never polled for: the run's start plus its maximum runtime;
the moment the run's cost reaches the limit at the run's (constant) hourly rate; the
moment the cluster will have been idle long enough. The reconciler sleeps until the
earliest one.

Nothing here raises on what a database row holds: a stored policy that does not
validate (written before the bounds existed, or by hand) reads as "not enforced" with
the reason (``read_policy``), and a deadline beyond ``HORIZON`` is "never" rather than
a datetime overflow (a tiny hourly rate makes any cost limit astronomically far).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Generic, TypeVar, cast

from pydantic import ValidationError

from gpuyard.core.models import AnyAutoTerminatePolicy, AutoTerminatePolicy

P = TypeVar("P", bound=AnyAutoTerminatePolicy)
# What each action is called once done ("auto-stopped: ...").
_DONE = {"stop": "stopped", "terminate": "terminated", "delete": "deleted"}

# A deadline further than this from its start never fires (and is not shown).
HORIZON = timedelta(days=100 * 365)


class Rule(StrEnum):
    MAX_RUNTIME = "max_runtime"
    COST_LIMIT = "cost_limit"
    IDLE = "idle"


@dataclass(frozen=True)
class Deadline:
    at: datetime
    rule: Rule
    action: str  # "stop" | "terminate" (clusters) | "delete" (training clusters)

    def reason(
        self,
        *,
        run_started_at: datetime,
        fired_at: datetime,
        rate: float,
        policy: AnyAutoTerminatePolicy,
        spent: float | None = None,
    ) -> str:
        """What the event log and lastStatusChange say when this deadline fires.
        ``spent``: the run's cost so far when known (else the rate times the hours)."""
        hours = (fired_at - run_started_at).total_seconds() / 3600
        verb = _DONE.get(self.action, "stopped")
        if self.rule == Rule.COST_LIMIT:
            spent = hours * rate if spent is None else spent
            return (
                f"auto-{verb}: cost limit {policy.cost_limit_usd:.2f} USD reached at "
                f"{spent:.4f} USD"
            )
        if self.rule == Rule.MAX_RUNTIME:
            return (
                f"auto-{verb}: max runtime {policy.max_runtime_hours:g} h reached at {hours:.4f} h"
            )
        return f"auto-{verb}: idle for {policy.idle_minutes:g} min"


@dataclass(frozen=True)
class StoredPolicy(Generic[P]):
    """A cluster's stored policy as the enforcer reads it: ``policy`` is what is
    enforced (None when disabled, without a rule, or invalid); ``error`` says why a
    stored policy that was meant to be enforced is not (None when it is valid)."""

    policy: P | None
    error: str | None = None


def read_policy(raw: object) -> StoredPolicy[AutoTerminatePolicy]:
    """Interpret a cluster's stored policy (see :func:`read_policy_as`)."""
    return read_policy_as(raw, AutoTerminatePolicy)


def read_policy_as(raw: object, model: type[P]) -> StoredPolicy[P]:
    """Interpret a stored policy as a ``model`` (a cluster's or a training cluster's);
    never raises, whatever the row holds. A disabled policy is not validated (nothing
    would be enforced either way)."""
    if raw is None or raw == {}:
        return StoredPolicy(None)
    if not isinstance(raw, dict):
        return StoredPolicy(
            None, f"the stored policy is a JSON {type(raw).__name__}, not an object"
        )
    if not raw.get("enabled"):
        return StoredPolicy(None)
    try:
        policy = cast(P, model.model_validate(raw))
    except ValidationError as exc:
        return StoredPolicy(None, problem(exc))
    if (
        policy.max_runtime_hours is None
        and policy.cost_limit_usd is None
        and policy.idle_minutes is None
    ):
        return StoredPolicy(None)
    return StoredPolicy(policy)


def problem(exc: ValidationError) -> str:
    """The first problem of a policy that does not validate, as ``field: message``."""
    errors = exc.errors()
    if not errors:
        return "invalid policy"
    first = errors[0]
    field = ".".join(str(p) for p in first.get("loc", ())) or "policy"
    message = "unknown field" if first.get("type") == "extra_forbidden" else first["msg"]
    return f"{field}: {message}"


def parse_policy(raw: object) -> AutoTerminatePolicy | None:
    """The stored policy when it is enabled, valid and has at least one rule, else
    None (never raises; ``read_policy`` also says why an invalid one is ignored)."""
    return read_policy(raw).policy


def shown_policy(raw: object) -> dict[str, Any]:
    """The stored policy as an API shows it: as stored, but always a JSON object that
    strict JSON can carry (a non-finite number becomes its name, ``"NaN"``; a stored
    value that is not an object is shown under ``stored``)."""
    if raw is None or raw == {}:
        return {"enabled": False}
    if not isinstance(raw, dict):
        return {"enabled": False, "stored": _json_safe(raw)}
    return {str(k): _json_safe(v) for k, v in raw.items()}


def _json_safe(value: object) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value


def after(start: datetime, seconds: float) -> datetime | None:
    """``start`` plus ``seconds``, or None ("never") when that is not a finite time
    within ``HORIZON`` of ``start`` or past the calendar's end."""
    if math.isnan(seconds) or seconds > HORIZON.total_seconds():
        return None
    try:
        return start + timedelta(seconds=max(seconds, 0.0))
    except OverflowError:
        return None


def idle_deadline(policy: AnyAutoTerminatePolicy, idle_since: datetime | None) -> Deadline | None:
    """When the idle rule fires for a cluster idle since ``idle_since`` (None: busy)."""
    if not policy.idle_minutes or idle_since is None:
        return None
    at = after(idle_since, policy.idle_minutes * 60)
    return Deadline(at, Rule.IDLE, policy.action) if at is not None else None


def deadlines(
    policy: AnyAutoTerminatePolicy,
    *,
    run_started_at: datetime,
    hourly_rate: float,
    idle_since: datetime | None,
    spent: tuple[datetime, float] | None = None,
) -> list[Deadline]:
    """Every rule's deadline, earliest first. ``idle_since`` is None while the cluster
    is busy (or not yet sampled); a zero rate never reaches a cost limit; a deadline
    beyond ``HORIZON`` is left out (it never fires). Never raises OverflowError.

    ``spent``: (when, USD) the run had cost by then, for a run whose rate changed
    (a training cluster that was scaled): the cost limit is reached that much sooner
    at ``hourly_rate`` from then on. None: the run billed ``hourly_rate`` throughout."""
    out: list[Deadline] = []
    if policy.max_runtime_hours is not None:
        at = after(run_started_at, policy.max_runtime_hours * 3600)
        if at is not None:
            out.append(Deadline(at, Rule.MAX_RUNTIME, policy.action))
    if policy.cost_limit_usd is not None and hourly_rate > 0:
        since, used = spent if spent is not None else (run_started_at, 0.0)
        at = after(since, (policy.cost_limit_usd - used) / hourly_rate * 3600)
        if at is not None:
            out.append(Deadline(at, Rule.COST_LIMIT, policy.action))
    idle = idle_deadline(policy, idle_since)
    if idle is not None:
        out.append(idle)
    return sorted(out, key=lambda d: d.at)


def run_started_at(
    start_initiated_at: datetime | None, started_at: datetime | None, created_at: datetime
) -> datetime:
    """The current run began when its start was requested (billing starts there too)."""
    return start_initiated_at or started_at or created_at
