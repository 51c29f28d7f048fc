"""Secret files: a password restic reads, written whole and private (0600)."""

from __future__ import annotations

import contextlib
import os
import secrets
import tempfile
from pathlib import Path

from gpuyard.core.errors import RuntimeFailure


class SecretFileError(RuntimeFailure):
    """A secret file that is empty."""


def ensure_secret_file(path: Path) -> str:
    """The secret in ``path`` (a random one written there first, 0600, when the file
    does not exist). Safe against racing writers: the loser reads the winner's.
    Raises SecretFileError when the file is empty."""
    if not path.exists():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        # Written whole to a private temporary file, then linked into place: link
        # fails if the name exists (like O_CREAT|O_EXCL) and, unlike an exclusive
        # open, never shows a racing reader a half-written password.
        write_secret_file(path, secrets.token_urlsafe(32), replace=False)
    secret = path.read_text().strip()
    if not secret:
        raise SecretFileError(f"the snapshot password file {path} is empty")
    return secret


def write_secret_file(path: Path, secret: str, *, replace: bool) -> None:
    """Write ``secret`` to ``path`` (0600) whole: a reader sees the old file or the
    new one, never a part. ``replace``: overwrite an existing file; else keep it."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(secret + "\n")
            f.flush()
            os.fsync(f.fileno())
        if replace:
            os.replace(tmp, path)
            return
        with contextlib.suppress(FileExistsError):
            os.link(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
