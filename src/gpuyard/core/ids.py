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


def new_snapshot_id() -> str:
    """``snap_`` and 9 lowercase characters (14 in all, so a snapshot's id fits every
    column that names a billed holder, as a cluster id does)."""
    return "snap_" + "".join(secrets.choice(_ALPHABET) for _ in range(9))


def new_network_volume_id() -> str:
    """A 10-character lowercase id, as RunPod network volume ids are."""
    return "".join(secrets.choice(_ALPHABET) for _ in range(10))
