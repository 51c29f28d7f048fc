"""Start-up work: migrations, the GPU catalog, the first admin key, the local host."""

from __future__ import annotations

import json
import logging
import os
import socket
from pathlib import Path

from sqlalchemy import Engine, select, update
from sqlalchemy.orm import Session, sessionmaker

from gpuyard.core.models import CloudType
from gpuyard.services.catalog.gpu_types import seed_catalog
from gpuyard.services.catalog.images import ensure_default_image
from gpuyard.services.catalog.plans import seed_plans
from gpuyard.services.context import Context
from gpuyard.services.fleet.discovery import discover
from gpuyard.services.fleet.hosts import register_host
from gpuyard.services.fleet.identity import HOST_ID_FILE, MACHINE_ID_PATH, local_host_id
from gpuyard.services.tenancy.auth import IssuedKey, bootstrap_admin
from gpuyard.services.tenancy.secrets import (
    holds_sealed_secrets,
    load_or_create_key,
    missing_key_error,
    seal_stored_secrets,
)
from gpuyard.settings import Settings
from gpuyard.store.db import make_engine, make_sessionmaker, truncate_wal
from gpuyard.store.locks import startup_lock, startup_xact_lock
from gpuyard.store.migrate import upgrade
from gpuyard.store.schema import Installation

# Files under the home that hold secrets or identities: owner-only, whatever the umask
# or an older version left (the database files are db.py's).
_PRIVATE_FILES = ("credentials", HOST_ID_FILE, "secret.key")

log = logging.getLogger(__name__)


def secure_home(home: Path) -> None:
    """Create ``home`` (0700) or set an existing one to 0700, and set the private files
    already in it to 0600, so no other local user reads the database, the credentials
    or the keys. Idempotent."""
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(home, 0o700)
    for name in _PRIVATE_FILES:
        path = home / name
        if path.is_file():
            os.chmod(path, 0o600)


def open_store(settings: Settings) -> tuple[Engine, sessionmaker[Session]]:
    """Secure the home, connect, bring the schema to the latest migration (the SQLite
    files are made owner-only by make_engine) and load the secret key — created on a
    first start, but never in place of a lost one: a missing key file while the store
    holds sealed values raises SecretKeyError. Replicas starting together on one
    PostgreSQL migrate one after the other (the start-up advisory lock): the first
    upgrades, the others find the schema at head."""
    secure_home(settings.home)
    engine = make_engine(settings.effective_database_url)
    with startup_lock(engine):
        upgrade(engine)
    sessions = make_sessionmaker(engine)
    key_path = settings.secret_key_path
    if not key_path.exists():
        with sessions() as session:
            if holds_sealed_secrets(session):
                engine.dispose()
                raise missing_key_error(key_path)
    load_or_create_key(key_path)
    return engine, sessions


def write_credentials(path: Path, url: str, key: str) -> None:
    """Write ``{"url", "api_key"}`` readable by the owner only (created 0600)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"url": url, "api_key": key}, f)
    os.chmod(path, 0o600)


def first_start(ctx: Context) -> IssuedKey | None:
    """Seed the catalog, the node plans and the default Slurm image (each only adds
    what is missing); on the very first start create the admin and its key, and save
    the key to the credentials file; seal plaintext secrets older versions stored
    (services/tenancy/secrets.py). Returns the key to print, else None. Safe when replicas
    start together on one database: their seeding transactions run one after the
    other (the start-up lock), so the later ones add nothing and create no key."""
    if _sealing_due(ctx):
        if seal_stored_secrets(ctx):
            # The WAL still holds the plaintext page versions the pass replaced.
            truncate_wal(ctx.sessions.kw["bind"])
        with ctx.transaction() as session:
            session.execute(update(Installation).values(secrets_sealed_at=ctx.clock.now()))
    with ctx.transaction() as session:
        startup_xact_lock(session)
        seed_catalog(session)
        # Plans derive from the catalog just seeded.
        session.flush()
        seed_plans(session)
        ensure_default_image(session)
        issued = bootstrap_admin(session)
    if issued is not None:
        write_credentials(ctx.settings.credentials_path, client_url(ctx.settings), issued.key)
    return issued


def _sealing_due(ctx: Context) -> bool:
    """Whether the plaintext-sealing pass has yet to run on this database: it reads
    every cluster row ever made, so it runs once (a database from before sealed
    secrets), not at every start."""
    with ctx.read() as session:
        sealed_at = session.scalar(select(Installation.secrets_sealed_at).limit(1))
    return sealed_at is None


def client_url(settings: Settings) -> str:
    """The URL a local client should use: a wildcard bind is reached on loopback."""
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(settings.host, settings.host)
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{settings.port}"


def register_local_host(
    ctx: Context,
    engine_url: str | None,
    *,
    machine_id_path: Path | None = MACHINE_ID_PATH,
    hostname: str | None = None,
) -> int:
    """Register (or refresh) the machine this server runs on; returns its host id.

    The row is the one of this machine's stable id (services/fleet/identity.py: the
    ``host-id`` file under GPUYARD_HOME, first derived from ``machine_id_path``), so a
    new ``hostname`` (default: the system's) renames the row instead of adding one.
    Raises HostIdentityError when the ``host-id`` file is damaged. Replicas on one
    machine (one home) registering together get the one row (the start-up lock).
    """
    s = ctx.settings
    machine_id = local_host_id(s.home, machine_id_path)
    inventory = discover(
        declared_gpus=s.local_gpus,
        vcpus=s.local_vcpus,
        memory_gb=s.local_memory_gb,
        disk_gb=s.local_disk_gb,
        disk_path=s.home,
        cuda_version=s.local_cuda_version,
    )
    if not inventory.gpus and s.local_gpus is None:
        log.warning(
            "no GPU found on this machine (NVML) and none declared: clusters that ask for "
            "GPUs will not fit here. Declare what it has with GPUYARD_LOCAL_GPUS, e.g. "
            "GPUYARD_LOCAL_GPUS='NVIDIA RTX A6000:4' (TYPE:COUNT, comma-separated; "
            "GET /v1/gpu-types lists the types), or add hosts that have GPUs (POST /v1/hosts)"
        )
    with ctx.transaction() as session:
        startup_xact_lock(session)
        host = register_host(
            session,
            machine_id=machine_id,
            name=hostname or socket.gethostname(),
            location=s.local_location,
            cloud_type=CloudType(s.local_cloud_type.upper()),
            address=s.public_address or ("127.0.0.1" if s.host in ("0.0.0.0", "::") else s.host),
            engine_url=engine_url,
            inventory=inventory,
        )
        return host.id
