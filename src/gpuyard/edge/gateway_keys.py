"""The SSH gateway's own keys, made once and kept under ``$GPUYARD_HOME/ssh-gateway``
(0700 directory, 0600 files): the host key users' clients remember, and the client
key the gateway logs into clusters' sshd with (its public half is put into the
container's ``/root/.ssh/authorized_keys`` before the gateway connects)."""

from __future__ import annotations

import os
from pathlib import Path

import asyncssh

from gpuyard.services.installation.files import gateway_dir

HOST_KEY = "host_ed25519"
UPSTREAM_KEY = "upstream_ed25519"


def load_or_create_key(path: Path) -> asyncssh.SSHKey:
    """The Ed25519 private key at ``path``, made (0600, written atomically) when
    missing. A key file another process wrote meanwhile wins (O_EXCL)."""
    if not path.exists():
        key = asyncssh.generate_private_key("ssh-ed25519", comment="gpuyard-ssh-gateway")
        data = key.export_private_key()
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    os.chmod(path, 0o600)
    return asyncssh.read_private_key(str(path))


def host_key(home: Path) -> asyncssh.SSHKey:
    return load_or_create_key(gateway_dir(home) / HOST_KEY)


def upstream_key(home: Path) -> asyncssh.SSHKey:
    return load_or_create_key(gateway_dir(home) / UPSTREAM_KEY)


def public_line(key: asyncssh.SSHKey) -> str:
    """The ``authorized_keys`` line of ``key``'s public half."""
    return key.export_public_key().decode().strip()
