"""The local machine's stable identity: what ties it to one host row, whatever its
hostname is today.

The id lives in ``GPUYARD_HOME/host-id`` (one lowercase UUID, created 0600 on the first
start). When that file does not exist yet it is derived from ``/etc/machine-id`` (a
UUID5 of it in gpuyard's own namespace, so the raw machine id, which systemd asks
applications not to expose, never leaves the machine), else it is a fresh random UUID.
Either way it is written to the file at once, so it never changes afterwards: not when
the hostname changes, and not when ``/etc/machine-id`` does.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from gpuyard.services.installation.files import write_once

MACHINE_ID_PATH = Path("/etc/machine-id")
HOST_ID_FILE = "host-id"
# gpuyard's namespace for ids derived from /etc/machine-id (a fixed, random UUID):
# another application hashing the same machine id gets a different value.
_NAMESPACE = uuid.UUID("f7f4f571-80e7-4734-b5e3-087a35d8ad59")


class HostIdentityError(RuntimeError):
    """The host-id file exists but holds no UUID (refused: a new id would register the
    machine a second time and offer its GPUs twice)."""


def derive_from_machine_id(machine_id_path: Path | None) -> str | None:
    """The UUID5 of the machine id in ``machine_id_path``; None when the file is
    absent, unreadable or empty."""
    if machine_id_path is None:
        return None
    try:
        raw = machine_id_path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None
    if not raw:
        return None
    return str(uuid.uuid5(_NAMESPACE, raw))


def read_host_id(path: Path) -> str | None:
    """The id stored at ``path``, or None when there is no file. Raises
    HostIdentityError when the file holds something other than a UUID."""
    try:
        text = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    try:
        return str(uuid.UUID(text))
    except ValueError as exc:
        raise HostIdentityError(
            f"{path} does not hold a UUID ({text[:40]!r}); restore it, or delete it to "
            "register this machine as a new host"
        ) from exc


def _write_once(path: Path, value: str) -> str:
    """Write ``value`` to ``path`` unless the file exists; returns what the file holds.

    Written with :func:`write_once`: of two servers starting at once on one home the
    first wins, and both answer its id.
    """
    write_once(path, value.encode())
    stored = read_host_id(path)
    if stored is None:  # linked above, or by the server that won the race
        raise HostIdentityError(f"{path} vanished while it was being created")
    return stored


def local_host_id(home: Path, machine_id_path: Path | None = MACHINE_ID_PATH) -> str:
    """This machine's host id (a lowercase UUID), stable across restarts and renames.

    Read from ``home/host-id``; on the first call derived from ``machine_id_path``
    (None: do not look) or drawn at random, and stored there (0600). Idempotent.
    Raises HostIdentityError when the file exists but is not a UUID.
    """
    path = home / HOST_ID_FILE
    stored = read_host_id(path)
    if stored is not None:
        return stored
    home.mkdir(parents=True, exist_ok=True)
    fresh = derive_from_machine_id(machine_id_path) or str(uuid.uuid4())
    return _write_once(path, fresh)
