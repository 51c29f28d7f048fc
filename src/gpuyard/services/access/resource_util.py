"""Helpers shared by the training-cluster resources (SSH keys, images, reserved IPs,
security groups): id lists from JSON bodies and the API's time format."""

from __future__ import annotations

from datetime import datetime

from gpuyard.core.errors import ValidationFailed
from gpuyard.services.clusters.requests import MAX_ID


def in_id_range(value: int) -> bool:
    """Whether ``value`` fits the store's 32-bit ids; larger values must never reach a
    query (PostgreSQL rejects them, SQLite overflows), they simply match nothing."""
    return 1 <= value <= MAX_ID


# More ids than anyone names at once in a request (keys, groups): a bound on the
# work one request can make while it holds the store's write lock.
MAX_IDS = 100


def id_list(ids: object, field: str, what: str) -> list[int]:
    """A non-empty JSON list of integer ids (booleans are not ids), de-duplicated in
    order. Raises ValidationFailed(field, ...). Ids out of range are kept, so the
    caller reports them as not found like any other unknown id."""
    if ids is None:
        raise ValidationFailed(field, f"is required (a list of {what} ids)")
    if not isinstance(ids, list):
        raise ValidationFailed(field, f"must be a list of {what} ids")
    if not ids:
        raise ValidationFailed(field, f"must name at least one {what}")
    if len(ids) > MAX_IDS:
        raise ValidationFailed(field, f"names {len(ids)} {what}s; at most {MAX_IDS} at once")
    out: dict[int, None] = {}
    for i, value in enumerate(ids):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValidationFailed(field, f"item {i} ({value!r:.40}) is not an integer id")
        out[value] = None
    return list(out)


def one_id(value: object, field: str, what: str) -> int:
    """One integer id from a JSON body (not a boolean, not a string)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationFailed(field, f"must be an integer {what} id")
    return value


def iso(t: datetime | None) -> str | None:
    """UTC time as ``2024-01-15T16:00:00Z``, as api/rest/schemas/cluster_json.py's ``iso``."""
    return t.replace(tzinfo=None).isoformat(timespec="seconds") + "Z" if t else None
