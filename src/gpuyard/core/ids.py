"""Identifier formats."""

from __future__ import annotations

import secrets
import string

_ALPHABET = string.ascii_lowercase + string.digits


def new_cluster_id() -> str:
    """A 14-character lowercase id, as RunPod pod ids are."""
    return "".join(secrets.choice(_ALPHABET) for _ in range(14))


def new_request_id() -> str:
    return "req_" + secrets.token_hex(8)
