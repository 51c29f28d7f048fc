"""Opaque keyset-pagination cursors.

A cursor carries the sort key of the last row of a page, so the next page is "rows
after this key" (an index range, however deep the page), never an offset. It is
base64url (unpadded) JSON::

    {"v": 1, "l": "<list>", "f": "<filter digest>", "k": [<key parts>]}

``l`` names the list it was made for and ``f`` digests the filter it was made under:
a cursor used on another list or with other filters is refused instead of silently
answering a page of something else. A cursor is not secret (it holds only the key of
a row the caller was shown), only tamper-evident enough to give a clear error.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from gpuyard.core.errors import ValidationFailed

VERSION = 1
# Far above any real cursor (a timestamp and an id): longer input is refused unread.
MAX_CURSOR_CHARS = 512
PARAM = "cursor"

KeyPart = str | int | datetime
FilterValue = str | int | bool | None
# What each part of a list's key is: "str", "int" or "time" (a datetime, ISO-encoded).
KeyShape = tuple[str, ...]


def filter_digest(filters: Mapping[str, FilterValue]) -> str:
    """A short stable digest of the filters a list was asked with (order-free)."""
    text = json.dumps(dict(sorted(filters.items())), separators=(",", ":"), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _encode_part(part: KeyPart) -> str | int:
    if isinstance(part, datetime):
        return part.isoformat()
    return part


def encode(list_name: str, filters: Mapping[str, FilterValue], key: Sequence[KeyPart]) -> str:
    """The cursor of the page after the row whose sort key is ``key``."""
    payload = {
        "v": VERSION,
        "l": list_name,
        "f": filter_digest(filters),
        "k": [_encode_part(p) for p in key],
    }
    raw = json.dumps(payload, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


# The longest text key part a cursor of ours carries (ids, ISO timestamps).
MAX_KEY_CHARS = 64


def _refuse(message: str) -> ValidationFailed:
    return ValidationFailed(PARAM, message)


def _payload(token: str) -> dict[str, Any]:
    if not token or len(token) > MAX_CURSOR_CHARS:
        raise _refuse("is not a cursor this API gave (use pagination.next_cursor as is)")
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        payload = json.loads(raw)
    except (binascii.Error, ValueError) as exc:  # UnicodeDecodeError is a ValueError
        raise _refuse("is not a cursor this API gave (use pagination.next_cursor as is)") from exc
    if not isinstance(payload, dict):
        raise _refuse("is not a cursor this API gave (use pagination.next_cursor as is)")
    return payload


def _decode_part(value: Any, kind: str) -> KeyPart:
    """One key part as ``kind`` says it is; ValueError when it is not."""
    if kind == "int":
        # Row ids: positive and within a database's BIGINT (anything else was not
        # made here, and would overflow the driver).
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 2**63:
            raise ValueError(kind)
        return value
    if not isinstance(value, str) or len(value) > MAX_KEY_CHARS or "\x00" in value:
        raise ValueError(kind)
    if kind == "time":
        moment = datetime.fromisoformat(value)
        if moment.tzinfo is None:
            raise ValueError(kind)
        return moment
    return value


def decode(
    token: str, list_name: str, filters: Mapping[str, FilterValue], shape: KeyShape
) -> tuple[KeyPart, ...]:
    """The sort key ``token`` carries, checked against the list and filters it is used
    with and the key's ``shape``. Raises ValidationFailed naming ``cursor`` for
    anything else: garbage, another version, another list, other filters."""
    payload = _payload(token)
    if payload.get("v") != VERSION:
        raise _refuse("was made by another version of this API; list again without it")
    if payload.get("l") != list_name:
        raise _refuse("belongs to another list")
    if payload.get("f") != filter_digest(filters):
        raise _refuse("was made for other filters; repeat the filters it came with")
    key = payload.get("k")
    if not isinstance(key, list) or len(key) != len(shape):
        raise _refuse("is not a cursor this API gave (use pagination.next_cursor as is)")
    try:
        return tuple(_decode_part(value, kind) for value, kind in zip(key, shape, strict=True))
    except ValueError as exc:
        raise _refuse("is not a cursor this API gave (use pagination.next_cursor as is)") from exc


def check_page(page: int, cursor: str | None) -> None:
    """``cursor`` pages by key and ``page`` by offset: asking for both (a page other
    than the first) is ambiguous, so it is refused."""
    if cursor is not None and page > 1:
        raise _refuse("cannot be combined with page (a cursor already says where to go on)")
