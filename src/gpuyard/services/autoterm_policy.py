"""Changing a cluster's auto-termination policy: an update merged over what is stored,
validated as a whole before anything is written.

The merge is where a policy stored before the bounds existed (a cost limit of 1e300,
``"action": null``) meets the user again: such a value is never carried into a new
policy silently; the answer names it, and the user sends a new value (or null to
remove that rule) in the same request.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from gpuyard.core.errors import ValidationFailed
from gpuyard.core.models import AutoTerminatePolicy
from gpuyard.services.requests import AutoTerminateUpdate


def merge_policy(stored: object, update: AutoTerminateUpdate, prefix: str = "") -> dict[str, Any]:
    """``stored`` with the fields ``update`` sent applied: enabled unless stored or
    sent otherwise, action ``stop`` unless stored or sent. Keys of ``stored`` that are
    not policy fields are dropped. Returns the validated policy as it is stored.

    Raises ValidationFailed (field ``prefix`` + the policy field) when the result does
    not validate; when the culprit is a stored value the update did not send, the
    message says so. Pure: nothing is read or written."""
    known = AutoTerminatePolicy.model_fields
    base = {k: v for k, v in stored.items() if k in known} if isinstance(stored, dict) else {}
    sent = update.model_dump(exclude_unset=True)
    merged = {**base, **sent}
    merged.setdefault("enabled", True)
    merged.setdefault("action", "stop")
    try:
        policy = AutoTerminatePolicy.model_validate(merged)
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


def _shown(value: object) -> str:
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)
