"""Identifier formats."""

from __future__ import annotations

import hashlib
import secrets
import string
import uuid
from contextvars import ContextVar, Token

_ALPHABET = string.ascii_lowercase + string.digits


# Random bytes below this map evenly onto the alphabet (7 x 36); the rest are dropped.
_EVEN = len(_ALPHABET) * (256 // len(_ALPHABET))


def _random_text(length: int) -> str:
    """``length`` characters of the alphabet, each uniformly random (one read of the
    system's random source, not one a character: ids are made in the create path)."""
    out = ""
    while len(out) < length:
        out += "".join(
            _ALPHABET[b % len(_ALPHABET)] for b in secrets.token_bytes(length + 4) if b < _EVEN
        )
    return out[:length]


def new_cluster_id() -> str:
    """A 14-character lowercase id, as RunPod pod ids are."""
    return _random_text(14)


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


def new_endpoint_id() -> str:
    """A 14-character lowercase id with at least one digit, as RunPod endpoint ids are;
    the digit keeps it apart from every collection name under ``/runpod/v2`` (``pods``,
    ``templates``, ``workers``, …), which the job routes share a prefix with."""
    while True:
        candidate = "".join(secrets.choice(_ALPHABET) for _ in range(14))
        if any(ch.isdigit() for ch in candidate):
            return candidate


def is_endpoint_id(text: str) -> bool:
    """Whether ``text`` has the shape of an endpoint id (never a collection's name)."""
    return (
        len(text) == 14 and all(ch in _ALPHABET for ch in text) and any(ch.isdigit() for ch in text)
    )


def new_job_id() -> str:
    """A serverless job's id: a UUID with a ``-u1`` suffix, the shape RunPod answers."""
    return f"{uuid.uuid4()}-u1"


def new_worker_id() -> str:
    """A serverless worker's id (its ``RUNPOD_POD_ID``): ``wk`` and 12 lowercase characters."""
    return "wk" + "".join(secrets.choice(_ALPHABET) for _ in range(12))


def new_worker_key() -> str:
    """A worker's secret (its ``RUNPOD_AI_API_KEY``); stored only as its SHA-256
    (``worker_key_hash``)."""
    return "gyw_" + secrets.token_urlsafe(32)


def worker_key_hash(key: str) -> str:
    """The hex SHA-256 a worker's key is stored and looked up by."""
    return hashlib.sha256(key.encode()).hexdigest()


def is_worker_key(text: str) -> bool:
    """Whether ``text`` has the shape of a worker's key (never an API key's)."""
    return text.startswith("gyw_") and len(text) >= 40
