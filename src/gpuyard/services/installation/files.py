"""Files under the gpuyard home that are written once and then only read."""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path


def write_once(path: Path, content: bytes) -> None:
    """Create ``path`` (mode 0600) holding ``content`` and a newline, unless it exists.

    The content goes to a private temporary file first and is hard-linked into place,
    so a reader never sees half of it, and of two servers starting at once on one home
    the first link wins (the other's content is dropped; both then read the winner's).
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(content + b"\n")
            f.flush()
            os.fsync(f.fileno())
        with contextlib.suppress(FileExistsError):
            os.link(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
