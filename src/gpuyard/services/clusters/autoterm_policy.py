"""Changing a cluster's auto-termination policy: an update merged over what is stored,
validated as a whole before anything is written.

The merge is where a policy stored before the bounds existed (a cost limit of 1e300,
``"action": null``) meets the user again: such a value is never carried into a new
policy silently; the answer names it, and the user sends a new value (or null to
remove that rule) in the same request.
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

from pydantic import ValidationError

from gpuyard.core.errors import ValidationFailed
from gpuyard.core.models import AutoTerminatePolicy, PolicyRules
from gpuyard.services.clusters.requests import RuleUpdates

U = TypeVar("U", bound=RuleUpdates)


def merge_policy(
    stored: object,
    update: RuleUpdates,
    prefix: str = "",
    model: type[PolicyRules] = AutoTerminatePolicy,
) -> dict[str, Any]:
    """``stored`` with the fields ``update`` sent applied: enabled unless stored or
    sent otherwise, action ``stop`` unless stored or sent. Keys of ``stored`` that are
    not fields of ``model`` (a cluster's policy, or a training cluster's) are dropped.
    Returns the validated policy as it is stored.

    Raises ValidationFailed (field ``prefix`` + the policy field) when the result does
    not validate; when the culprit is a stored value the update did not send, the
    message says so. Pure: nothing is read or written."""
    known = model.model_fields
    base = {k: v for k, v in stored.items() if k in known} if isinstance(stored, dict) else {}
    sent = update.model_dump(exclude_unset=True)
    merged = {**base, **sent}
    merged.setdefault("enabled", True)
    merged.setdefault("action", "stop")
    try:
        policy = model.model_validate(merged)
    except ValidationError as exc:
        first = exc.errors()[0]
        name = str(first["loc"][0]) if first["loc"] else "auto_terminate"
        message = str(first["msg"])
        if name in base and name not in sent:
            message = (
                f"the stored value {_shown(merged.get(name))} is not valid ({message}); "
                "send a new value in this request (null removes a rule)"
            )
        raise ValidationFailed(prefix + name, message) from None
    return policy.model_dump()


def parse_update(raw: object, model: type[U], field: str) -> U:
    """A policy change as JSON gave it (an object of ``model``'s fields), validated.
    Raises ValidationFailed naming ``field`` or ``field.<policy field>``, with the
    bounds' message the cluster API gives."""
    if not isinstance(raw, dict):
        raise ValidationFailed(
            field,
            "must be an object with idle_minutes, cost_limit_usd, max_runtime_hours, "
            "action and enabled (each optional)",
        )
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        message = "unknown field" if first["type"] == "extra_forbidden" else str(first["msg"])
        raise ValidationFailed(f"{field}.{loc}" if loc else field, message) from None


def _shown(value: object) -> str:
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)
