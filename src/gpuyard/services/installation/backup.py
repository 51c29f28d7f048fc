"""Backup and restore of an installation: its database and what it needs to be itself.

A backup is one gzipped tar archive (0600): ``manifest.json``, the database (an online,
consistent copy: SQLite's backup API, or ``pg_dump``) and the files of the installation's
identity under ``files/``: the secret key that seals stored secrets, the snapshot
repositories' password (every account's is derived from it), the SSH client key and
known hosts hosts are reached with, the SSH gateway's host keys, the admin credentials
and this machine's host id. The installation id is a row of the database. Snapshot data
(a restic repository, ``<home>/snapshots`` by default) is not in it: back that up with
restic itself.

A restore writes all of it into an empty home (and an empty database): the next
``gpuyard serve`` is the same installation. It deletes nothing on any engine: clusters
of the backup find their containers and volumes there and are adopted; what was made
after the backup is unknown to the restored database, so its containers are stopped
and kept and its volumes quarantined, both left to an admin (reconciler/duties/orphans.py).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import sqlite3
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import inspect, select, update
from sqlalchemy.engine import make_url

from gpuyard import __version__
from gpuyard.core.errors import GpuyardError
from gpuyard.services.fleet.identity import HOST_ID_FILE
from gpuyard.services.installation.files import gateway_dir
from gpuyard.settings import Settings
from gpuyard.store.db import make_engine, secure_sqlite_files
from gpuyard.store.migrate import upgrade
from gpuyard.store.schema import Installation

FORMAT = 1
MANIFEST = "manifest.json"
SQLITE_MEMBER = "database/gpuyard.db"
POSTGRES_MEMBER = "database/gpuyard.pgdump"


class BackupError(GpuyardError):
    """A backup or restore that cannot be done; the message says why and what to do."""

    code = "BACKUP_ERROR"
    http_status = 409


@dataclass(frozen=True)
class BackupSummary:
    """What an archive holds."""

    path: Path
    installation_id: str
    created_at: str
    database: str  # "sqlite" | "postgresql"
    files: tuple[str, ...]


def identity_files(settings: Settings) -> dict[str, Path]:
    """Archive name -> where it lives, for every file of the installation's identity
    that exists now (directories are taken file by file, sockets and logs left out)."""
    home = settings.home
    found: dict[str, Path] = {}
    for name, path in (
        ("secret.key", settings.secret_key_path),
        ("snapshot.password", settings.snapshot_password_path),
        ("credentials", settings.credentials_path),
        (HOST_ID_FILE, home / HOST_ID_FILE),
    ):
        if path.is_file():
            found[name] = path
    for prefix, folder in (("ssh", home / "ssh"), ("ssh-gateway", gateway_dir(home))):
        if folder.is_dir():
            for entry in sorted(folder.iterdir()):
                if entry.is_file() and entry.suffix not in (".sock", ".log"):
                    found[f"{prefix}/{entry.name}"] = entry
    return found


def _restore_target(settings: Settings, name: str) -> Path:
    """Where archive file ``name`` goes in the restoring installation's settings."""
    fixed = {
        "secret.key": settings.secret_key_path,
        "snapshot.password": settings.snapshot_password_path,
        "credentials": settings.credentials_path,
        HOST_ID_FILE: settings.home / HOST_ID_FILE,
    }
    if name in fixed:
        return fixed[name]
    prefix, _, leaf = name.partition("/")
    if prefix == "ssh" and _plain(leaf):
        return settings.home / "ssh" / leaf
    if prefix == "ssh-gateway" and _plain(leaf):
        return gateway_dir(settings.home) / leaf
    raise BackupError(f"the archive holds an unexpected file {name!r}; it is not a gpuyard backup")


def _plain(leaf: str) -> bool:
    return bool(leaf) and "/" not in leaf and leaf not in (".", "..")


def _sqlite_path(url: str) -> Path | None:
    """The file of a SQLite database URL; None for any other database."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return None
    if not parsed.database or parsed.database == ":memory:":
        raise BackupError("an in-memory SQLite database cannot be backed up or restored")
    return Path(parsed.database)


def _libpq_url(url: str) -> str:
    """The URL ``pg_dump``/``pg_restore`` take (no SQLAlchemy driver name)."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


# -- backup ----------------------------------------------------------------------------


def backup(settings: Settings, target: Path, *, now: datetime | None = None) -> BackupSummary:
    """Write a backup of the installation of ``settings`` to ``target`` (a new file)
    while it runs. Raises BackupError when ``target`` exists or there is nothing to
    back up."""
    target = Path(target)
    if target.exists():
        raise BackupError(f"{target} exists; name a new file")
    url = settings.effective_database_url
    sqlite_file = _sqlite_path(url)
    if sqlite_file is not None and not sqlite_file.is_file():
        raise BackupError(f"no database at {sqlite_file}: nothing to back up")
    created_at = (now or datetime.now(UTC)).isoformat()
    files = identity_files(settings)
    with tempfile.TemporaryDirectory(prefix="gpuyard-backup-") as scratch:
        if sqlite_file is not None:
            dump, member, database = Path(scratch) / "gpuyard.db", SQLITE_MEMBER, "sqlite"
            _sqlite_copy(sqlite_file, dump)
            installation_id = _installation_id(f"sqlite:///{dump}")
        else:
            dump, member, database = Path(scratch) / "gpuyard.pgdump", POSTGRES_MEMBER, "postgresql"
            installation_id = _installation_id(url)
            _run(["pg_dump", "--format=custom", "--no-owner", f"--file={dump}", _libpq_url(url)])
        manifest = {
            "format": FORMAT,
            "gpuyard_version": __version__,
            "installation_id": installation_id,
            "created_at": created_at,
            "database": database,
            "files": sorted(files),
        }
        partial = target.with_name(f".{target.name}.partial")
        target.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            with os.fdopen(fd, "wb") as raw, tarfile.open(fileobj=raw, mode="w:gz") as tar:
                _add_bytes(tar, MANIFEST, json.dumps(manifest, indent=2).encode())
                tar.add(dump, arcname=member)
                for name, path in files.items():
                    tar.add(path, arcname=f"files/{name}")
            os.replace(partial, target)
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
    return BackupSummary(target, installation_id, created_at, database, tuple(sorted(files)))


def _sqlite_copy(source: Path, dest: Path) -> None:
    """An online, consistent copy of a live SQLite database (its backup API: the pages
    as of one moment, whatever the server writes meanwhile)."""
    src = sqlite3.connect(source, timeout=30)
    try:
        out = sqlite3.connect(dest)
        try:
            src.backup(out)
        finally:
            out.close()
    finally:
        src.close()


def _installation_id(url: str) -> str:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            if not inspect(conn).has_table(Installation.__tablename__):
                raise BackupError("the database holds no installation yet: nothing to back up")
            found = conn.execute(
                select(Installation.uuid).order_by(Installation.id).limit(1)
            ).scalar()
    finally:
        engine.dispose()
    if found is None:
        raise BackupError("the database holds no installation yet: nothing to back up")
    return str(found)


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), 0o600
    info.mtime = int(datetime.now(UTC).timestamp())
    tar.addfile(info, io.BytesIO(data))


def _run(argv: list[str]) -> None:
    if shutil.which(argv[0]) is None:
        raise BackupError(f"{argv[0]} is not installed (PostgreSQL's client tools)")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise BackupError(f"{argv[0]} failed: {done.stderr.strip()[-500:]}")


# -- restore ---------------------------------------------------------------------------


def read_manifest(archive: Path) -> dict[str, object]:
    """The manifest of backup ``archive``; BackupError when it is not one."""
    try:
        with tarfile.open(archive, mode="r:gz") as tar:
            member = tar.extractfile(MANIFEST)
            if member is None:
                raise KeyError(MANIFEST)
            manifest: dict[str, object] = json.loads(member.read())
    except (OSError, tarfile.TarError, KeyError, ValueError) as exc:
        raise BackupError(f"{archive} is not a gpuyard backup ({exc})") from exc
    if manifest.get("format") != FORMAT:
        raise BackupError(f"{archive} has backup format {manifest.get('format')!r}; expected 1")
    return manifest


def restore(settings: Settings, archive: Path, *, now: datetime | None = None) -> BackupSummary:
    """Bring back the installation of backup ``archive`` into the home and database of
    ``settings``, both of which must hold no installation yet (BackupError: nothing is
    overwritten). Files are written owner-only. The database is brought to this
    version's schema and remembers the restore (``installation.restored_at``, ``now``):
    volumes of ours found then that it does not know are kept until an admin deletes
    them (reconciler/duties/orphans.py)."""
    archive = Path(archive)
    manifest = read_manifest(archive)
    url = settings.effective_database_url
    sqlite_file = _sqlite_path(url)
    database = str(manifest.get("database"))
    if (database == "sqlite") != (sqlite_file is not None):
        raise BackupError(
            f"the backup holds a {database} database but GPUYARD_DATABASE_URL names "
            f"{make_url(url).get_backend_name()}: restore into the same kind of database"
        )
    _refuse_existing(settings, sqlite_file, url)
    written: list[Path] = []
    try:
        names = _restore_into(settings, archive, sqlite_file, url, written)
        _mark_restored(url, now or datetime.now(UTC))
    except BaseException:
        # A restore cut short leaves the home as it found it (a PostgreSQL database
        # may keep what pg_restore wrote: restore again into a new empty one).
        for path in reversed(written):
            path.unlink(missing_ok=True)
        raise
    return BackupSummary(
        archive,
        str(manifest.get("installation_id")),
        str(manifest.get("created_at")),
        database,
        tuple(n.removeprefix("files/") for n in names),
    )


def _restore_into(
    settings: Settings, archive: Path, sqlite_file: Path | None, url: str, written: list[Path]
) -> list[str]:
    """Write the archive's database and files (each path written is added to
    ``written``); the archive names of the files. Refuses a file that exists."""
    with tarfile.open(archive, mode="r:gz") as tar:
        names = [m.name for m in _regular(tar) if m.name.startswith("files/")]
        targets = {name: _restore_target(settings, name.removeprefix("files/")) for name in names}
        taken = [str(path) for path in targets.values() if path.exists()]
        if taken:
            raise BackupError(
                f"{', '.join(taken)} exist(s): restore only into a new home (move the old one away)"
            )
        settings.home.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(settings.home, 0o700)
        with tempfile.TemporaryDirectory(prefix="gpuyard-restore-") as scratch:
            member = SQLITE_MEMBER if sqlite_file is not None else POSTGRES_MEMBER
            dump = Path(scratch) / "database"
            _extract(tar, member, dump)
            if sqlite_file is not None:
                sqlite_file.parent.mkdir(parents=True, exist_ok=True)
                written.append(sqlite_file)
                secure_sqlite_files(sqlite_file)
                shutil.copyfile(dump, sqlite_file)
            else:
                _run(["pg_restore", "--no-owner", "--exit-on-error",
                      f"--dbname={_libpq_url(url)}", str(dump)])  # fmt: skip
        for name, path in targets.items():
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            written.append(path)
            _extract(tar, name, path)
    return names


def _mark_restored(url: str, now: datetime) -> None:
    engine = make_engine(url)
    try:
        upgrade(engine)
        with engine.begin() as conn:
            conn.execute(update(Installation).values(restored_at=now))
    finally:
        engine.dispose()


def _refuse_existing(settings: Settings, sqlite_file: Path | None, url: str) -> None:
    """BackupError when the target already is (or holds part of) an installation."""
    if sqlite_file is not None and sqlite_file.exists() and sqlite_file.stat().st_size > 0:
        raise BackupError(
            f"{sqlite_file} exists: restore only into a new home (move the old one away)"
        )
    if sqlite_file is None:
        engine = make_engine(url)
        try:
            with engine.connect() as conn:
                if inspect(conn).has_table(Installation.__tablename__):
                    raise BackupError(
                        "the database already holds an installation: restore only into an "
                        "empty database"
                    )
        finally:
            engine.dispose()
    if settings.secret_key_path.exists():
        raise BackupError(
            f"{settings.secret_key_path} exists: restore only into a new home (move the "
            "old one away)"
        )


def _regular(tar: tarfile.TarFile) -> Iterator[tarfile.TarInfo]:
    for member in tar.getmembers():
        if member.isfile():
            yield member


def _extract(tar: tarfile.TarFile, name: str, dest: Path) -> None:
    """Write member ``name`` to ``dest`` (0600), never following the archive's paths."""
    try:
        source = tar.extractfile(name)
    except KeyError:
        source = None
    if source is None:
        raise BackupError(f"the backup lacks {name}")
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        shutil.copyfileobj(source, out)
    os.chmod(dest, 0o600)
