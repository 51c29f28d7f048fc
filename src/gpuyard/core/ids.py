"""Identifier formats."""

from __future__ import annotations

import secrets
import string
from contextvars import ContextVar, Token

_ALPHABET = string.ascii_lowercase + string.digits


def new_cluster_id() -> str:
    """A 14-character lowercase id, as RunPod pod ids are."""
    return "".join(secrets.choice(_ALPHABET) for _ in range(14))


# The id of the request being served (set by api/http/request_ids.py): every envelope and
# audit event of one request carries the same id.
_CURRENT_REQUEST_ID: ContextVar[str | None] = ContextVar("gpuyard_request_id", default=None)


def new_request_id() -> str:
    """The current request's id when one is being served, else a fresh one."""
    return _CURRENT_REQUEST_ID.get() or "req_" + secrets.token_hex(8)


def begin_request() -> Token[str | None]:
    """Give the request served in this context an id of its own; reset with the token."""
    return _CURRENT_REQUEST_ID.set("req_" + secrets.token_hex(8))


def end_request(token: Token[str | None]) -> None:
    _CURRENT_REQUEST_ID.reset(token)


def new_snapshot_id() -> str:
    """``snap_`` and 9 lowercase characters (14 in all, so a snapshot's id fits every
    column that names a billed holder, as a cluster id does)."""
    return "snap_" + "".join(secrets.choice(_ALPHABET) for _ in range(9))


def new_network_volume_id() -> str:
    """A 10-character lowercase id, as RunPod network volume ids are."""
    return "".join(secrets.choice(_ALPHABET) for _ in range(10))


def new_template_id() -> str:
    """A 10-character lowercase id, as RunPod template ids are."""
    return "".join(secrets.choice(_ALPHABET) for _ in range(10))
