"""Secrets at rest: the installation's key file and the sealing of secret values.

Secret environment values (core/secret_env.py says which) and training clusters'
munge keys are stored as ``gysec:v1:<Fernet token>``. The key is a Fernet key in
``Settings.secret_key_path`` (``<home>/secret.key`` by default), created 0600 on the
first start and never rotated by gpuyard. Losing it makes the sealed values
unreadable: a cluster whose env cannot be opened fails its start with
:class:`SecretUnreadable` naming the file, nothing else breaks.

Values are opened only where a container is built (reconciler/clusters/driver.py) or a node's
files are written (reconciler/training/operator.py); API answers show masks
(core/secret_env.py). A stored value without the prefix is plaintext from before
this module and is read as is; it is sealed on the row's next env write, and at
start by :func:`seal_stored_secrets`.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import os
import threading
from collections.abc import Collection, Mapping
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken
from sqlalchemy import Text, cast, select, update
from sqlalchemy.orm import Session

from gpuyard.core.errors import GpuyardError
from gpuyard.core.secret_env import MASK, SEALED_PREFIX, is_sealed, is_secret, is_secret_by_name
from gpuyard.services.context import Context
from gpuyard.services.installation.files import write_once
from gpuyard.settings import Settings
from gpuyard.store.schema import AccountSecret, Cluster, ClusterTemplate, TrainingCluster

log = logging.getLogger(__name__)


class SecretKeyError(RuntimeError):
    """The key file exists but does not hold a Fernet key (refused at start: a new key
    would make every stored secret unreadable)."""


class SecretUnreadable(GpuyardError):
    """A sealed value cannot be opened with this installation's key."""

    code = "SECRET_UNREADABLE"


def load_or_create_key(path: Path) -> bytes:
    """The Fernet key in ``path``, created (0600, parent 0700 when made here) on the
    first call. The file's mode is set to 0600 each time. Raises SecretKeyError when
    the file holds something else."""
    if not path.exists():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_once(path, Fernet.generate_key())
    os.chmod(path, 0o600)
    key = path.read_bytes().strip()
    try:
        Fernet(key)
    except (ValueError, TypeError) as exc:
        raise SecretKeyError(
            f"{path} does not hold a secret key; restore it from a backup (the stored "
            "secrets need it), or remove it to start with a new key, which makes every "
            "stored secret unreadable"
        ) from exc
    return key


def holds_sealed_secrets(session: Session) -> bool:
    """Whether the store holds any sealed value (a cluster's or a template's env, a
    munge key, an account secret): then a missing key file is a lost key, not a first
    start."""
    pattern = f"%{SEALED_PREFIX}%"
    env = session.scalar(select(Cluster.id).where(cast(Cluster.env, Text).like(pattern)).limit(1))
    template = session.scalar(
        select(ClusterTemplate.id).where(cast(ClusterTemplate.env, Text).like(pattern)).limit(1)
    )
    munge = session.scalar(
        select(TrainingCluster.id).where(TrainingCluster.munge_key.like(pattern)).limit(1)
    )
    account = session.scalar(select(AccountSecret.id).limit(1))
    return env is not None or template is not None or munge is not None or account is not None


def missing_key_error(path: Path) -> SecretKeyError:
    return SecretKeyError(
        f"{path} is missing, but the database holds secrets sealed with it; restore the "
        "key file from a backup (or point GPUYARD_SECRET_KEY_FILE at it). Replicas that "
        "share a database must share this file."
    )


class SecretBox:
    """Seals and opens values with one Fernet key. Thread-safe."""

    def __init__(self, key: bytes, source: Path | None = None) -> None:
        self._fernet = Fernet(key)
        self._key = key
        self._source = source

    def seal(self, plaintext: str) -> str:
        """``plaintext`` encrypted, as stored (``gysec:v1:...``)."""
        return SEALED_PREFIX + self._fernet.encrypt(plaintext.encode()).decode()

    def derive(self, label: str) -> str:
        """A secret of this installation for ``label``: HMAC-SHA256 of the key, URL-safe
        base64. Stable while the key file is; never stored."""
        digest = hmac.new(self._key, label.encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).decode().rstrip("=")

    def open(self, stored: str) -> str:
        """The plaintext of a stored value; a value without the prefix is returned as
        is (stored before encryption existed). Raises SecretUnreadable."""
        if not is_sealed(stored):
            return stored
        try:
            return self._fernet.decrypt(stored[len(SEALED_PREFIX) :].encode()).decode()
        except (InvalidToken, UnicodeDecodeError) as exc:
            where = f" with {self._source}" if self._source else ""
            raise SecretUnreadable(
                f"a stored secret cannot be decrypted{where}: the installation's secret "
                "key changed or was lost; set the value again"
            ) from exc


_boxes: dict[Path, SecretBox] = {}
_boxes_lock = threading.Lock()


def secret_box(settings: Settings) -> SecretBox:
    """The box of ``settings``' key file (created on first use), cached per file."""
    path = settings.secret_key_path
    with _boxes_lock:
        box = _boxes.get(path)
        if box is None:
            box = _boxes[path] = SecretBox(load_or_create_key(path), path)
        return box


# ------------------------------------------------------------------ env values


def _seal_value(box: SecretBox, name: str, value: str, secret: bool) -> str:
    # A plaintext that looks sealed is sealed too, so "stored value has the prefix"
    # always means "encrypted by us" and a user cannot have us "open" a value.
    if secret or is_secret_by_name(name, value) or is_sealed(value):
        return box.seal(value)
    return value


def seal_env(
    box: SecretBox, env: Mapping[str, str], marked: Collection[str] = ()
) -> dict[str, str]:
    """A new cluster's env as stored: secret values (by name, or ``marked``) sealed."""
    return {name: _seal_value(box, name, value, name in marked) for name, value in env.items()}


def reseal_env(box: SecretBox, stored: Mapping[str, str]) -> dict[str, str]:
    """``stored`` with every plaintext value that is secret by name sealed (rows
    written before encryption existed); references to account secrets stay as they
    are."""
    return {
        name: box.seal(value) if is_secret_by_name(name, value) and not is_sealed(value) else value
        for name, value in stored.items()
    }


def update_env(
    box: SecretBox,
    stored: Mapping[str, str],
    updates: Mapping[str, str | None],
    marked: Collection[str] = (),
) -> dict[str, str]:
    """``stored`` after ``updates`` (a None value removes the variable).

    The mask sent back for a secret variable keeps its stored value, so a client that
    reads a cluster and writes its env back changes nothing. A variable that was
    secret stays secret when given a new value. Plaintext secrets left from before
    encryption are sealed on the way.
    """
    env = dict(stored)
    for name, value in updates.items():
        old = env.get(name)
        if value is None:
            env.pop(name, None)
        elif value == MASK and old is not None and is_secret(name, old):
            continue
        else:
            secret = name in marked or (old is not None and is_sealed(old))
            env[name] = _seal_value(box, name, value, secret)
    return reseal_env(box, env)


def open_env(box: SecretBox, stored: Mapping[str, str]) -> dict[str, str]:
    """The env a container gets: every value in plaintext. Raises SecretUnreadable."""
    return {name: box.open(value) for name, value in stored.items()}


# ------------------------------------------------------------------ start-up pass


def seal_stored_secrets(ctx: Context, batch: int = 500) -> int:
    """Seal plaintext secrets left by older versions: env values secret by name and
    training clusters' munge keys. Each row is written with a guarded update (its
    version, or its old munge key, unchanged), so a concurrent writer wins and its
    own write seals the row. Idempotent; returns the number of rows sealed."""
    box = secret_box(ctx.settings)
    sealed = 0
    last = ""
    while True:
        with ctx.read() as session:
            rows = session.execute(
                select(Cluster.id, Cluster.env, Cluster.version)
                .where(Cluster.id > last)
                .order_by(Cluster.id)
                .limit(batch)
            ).all()
        if not rows:
            break
        last = rows[-1].id
        for row in rows:
            env = dict(row.env or {})
            new = reseal_env(box, env)
            if new == env:
                continue
            with ctx.transaction() as session:
                result = session.execute(
                    update(Cluster)
                    .where(Cluster.id == row.id, Cluster.version == row.version)
                    .values(env=new)
                    .execution_options(synchronize_session=False)
                )
                sealed += int(getattr(result, "rowcount", 0) or 0)
    with ctx.read() as session:
        keys = session.execute(
            select(TrainingCluster.id, TrainingCluster.munge_key).where(
                TrainingCluster.munge_key.not_like(SEALED_PREFIX + "%")
            )
        ).all()
    for key_row in keys:
        with ctx.transaction() as session:
            result = session.execute(
                update(TrainingCluster)
                .where(
                    TrainingCluster.id == key_row.id,
                    TrainingCluster.munge_key == key_row.munge_key,
                )
                .values(munge_key=box.seal(key_row.munge_key))
                .execution_options(synchronize_session=False)
            )
            sealed += int(getattr(result, "rowcount", 0) or 0)
    if sealed:
        log.info("sealed the plaintext secrets of %d stored rows", sealed)
    return sealed
