"""This process's identity among API replicas on one database."""

from __future__ import annotations

import os
import socket
import uuid

# leases.holder is String(100): room for the uuid, the pid and a shortened hostname.
_HOSTNAME_MAX = 50


def replica_id(hostname: str | None = None, pid: int | None = None) -> str:
    """A new id, unique per call: ``<hostname>:<pid>:<uuid4 hex>``. The hostname and
    pid are for people reading the ``leases`` table; the uuid makes it unique (a
    restarted process may get the same pid, a container the same hostname). At most
    100 characters. Call it once per process and keep the answer."""
    host = (hostname if hostname is not None else socket.gethostname())[:_HOSTNAME_MAX]
    return f"{host}:{pid if pid is not None else os.getpid()}:{uuid.uuid4().hex}"
