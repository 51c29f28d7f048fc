"""Backup and restore of an installation (services/installation/backup.py, ``gpuyard backup`` and
``gpuyard restore``): the database copied while it is open, with the files of the
installation's identity, brought back into a new home as the same installation."""

from __future__ import annotations

import os
import stat
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import select

from gpuyard.cli.main import cli
from gpuyard.runtimes.hosts.ssh_tunnel import SshKeys
from gpuyard.services.clock import FakeClock
from gpuyard.services.context import Context
from gpuyard.services.installation.backup import BackupError, backup, identity_files, restore
from gpuyard.services.installation.bootstrap import first_start, open_store, register_local_host
from gpuyard.services.installation.identity import ensure_installation
from gpuyard.settings import Settings
from gpuyard.store.schema import Host, Installation
from tests.conftest import _pg_database
from tests.helpers import make_settings


@pytest.fixture
def live(tmp_path: Path, database_url: str) -> Iterator[Context]:
    """A started installation, its store open (as a running server's is); SQLite has
    it in its home."""
    url = None if database_url.startswith("sqlite") else database_url
    settings = make_settings(tmp_path / "old-home", url)
    engine, sessions = open_store(settings)
    with sessions.begin() as session:
        owner = ensure_installation(session)
    ctx = Context(sessions=sessions, settings=settings, clock=FakeClock(), ownership=owner)
    first_start(ctx)
    register_local_host(ctx, None)
    SshKeys(settings.home).ensure()
    (settings.home / "ssh" / "known_hosts").write_text("10.0.0.9 ssh-ed25519 AAAA\n")
    settings.snapshot_password_path.write_text("repository-password\n")
    yield ctx
    engine.dispose()


def _installation(settings: Settings) -> str:
    engine, sessions = open_store(settings)
    try:
        with sessions() as s:
            return str(s.scalar(select(Installation.uuid)))
    finally:
        engine.dispose()


@pytest.fixture
def fresh_url(database_url: str) -> Iterator[str | None]:
    """Another empty database of the same kind (None: SQLite, in the new home)."""
    if database_url.startswith("sqlite"):
        yield None
        return
    yield from _pg_database()


def test_restore_into_a_new_home_is_the_same_installation(
    live: Context, tmp_path: Path, fresh_url: str | None
) -> None:
    old = live.settings
    archive = tmp_path / "backups" / "gpuyard.tar.gz"
    made = backup(old, archive)
    assert made.installation_id == live.ownership.installation_id
    assert stat.S_IMODE(archive.stat().st_mode) == 0o600
    kept = {"secret.key", "snapshot.password", "credentials", "host-id", "ssh/known_hosts"}
    assert kept | {"ssh/id_ed25519", "ssh/id_ed25519.pub"} <= set(made.files)
    # Written while the store is open: this write comes after the copy.
    with live.transaction() as s:
        s.scalars(select(Host)).first().name = "renamed-after"  # type: ignore[union-attr]

    new = make_settings(tmp_path / "new-home", fresh_url)
    done = restore(new, archive)
    assert done.installation_id == made.installation_id
    for name, path in identity_files(old).items():
        again = identity_files(new)[name]
        assert again.read_bytes() == path.read_bytes(), name
        assert stat.S_IMODE(again.stat().st_mode) == 0o600, name
    assert stat.S_IMODE(os.stat(new.home).st_mode) == 0o700
    assert _installation(new) == made.installation_id
    engine, sessions = open_store(new)
    try:
        with sessions() as s:
            assert s.scalar(select(Installation.restored_at)) is not None
    finally:
        engine.dispose()
    engine, sessions = open_store(new)
    try:
        with sessions() as s:
            assert "renamed-after" not in {h.name for h in s.scalars(select(Host))}
    finally:
        engine.dispose()


def test_restore_overwrites_nothing(live: Context, tmp_path: Path, fresh_url: str | None) -> None:
    archive = tmp_path / "b.tar.gz"
    backup(live.settings, archive)
    with pytest.raises(BackupError, match="exists"):
        backup(live.settings, archive)  # an existing file is not replaced
    with pytest.raises(BackupError, match=r"new home|empty database"):
        restore(live.settings, archive)  # the live home: refused, untouched
    assert _installation(live.settings) == live.ownership.installation_id
    key_only = make_settings(tmp_path / "half", fresh_url)
    key_only.home.mkdir()
    key_only.secret_key_path.write_text("another key")
    with pytest.raises(BackupError, match=r"secret\.key exists"):
        restore(key_only, archive)
    assert key_only.secret_key_path.read_text() == "another key"
    # A home with an SSH key of its own: refused before anything is written.
    ssh_only = make_settings(tmp_path / "ssh-only", fresh_url)
    SshKeys(ssh_only.home).ensure()
    with pytest.raises(BackupError, match="id_ed25519"):
        restore(ssh_only, archive)
    assert sorted(p.name for p in ssh_only.home.iterdir()) == ["ssh"]


def test_a_file_that_is_not_a_backup_is_refused(tmp_path: Path) -> None:
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"not an archive")
    with pytest.raises(BackupError, match="not a gpuyard backup"):
        restore(make_settings(tmp_path / "home"), junk)
    sneaky = tmp_path / "sneaky.tar.gz"
    with tarfile.open(sneaky, "w:gz") as tar:
        manifest = tmp_path / "manifest.json"
        manifest.write_text('{"format": 1, "database": "sqlite"}')
        tar.add(manifest, arcname="manifest.json")
        tar.add(manifest, arcname="files/../../escape")
    with pytest.raises(BackupError, match="unexpected file"):
        restore(make_settings(tmp_path / "home2"), sneaky)
    assert not (tmp_path / "escape").exists()


def test_cli_backup_and_restore(live: Context, tmp_path: Path, fresh_url: str | None) -> None:
    archive = tmp_path / "cli.tar.gz"
    runner = CliRunner()
    env = {"GPUYARD_HOME": str(live.settings.home)}
    if live.settings.database_url:
        env["GPUYARD_DATABASE_URL"] = live.settings.database_url
    made = runner.invoke(cli, ["backup", str(archive)], env=env)
    assert made.exit_code == 0, made.output
    assert live.ownership.installation_id in made.output
    again = runner.invoke(cli, ["backup", str(archive)], env=env)
    assert again.exit_code == 1 and "exists" in again.output
    home = tmp_path / "cli-home"
    fresh = {"GPUYARD_HOME": str(home)}
    if fresh_url:
        fresh["GPUYARD_DATABASE_URL"] = fresh_url
    back = runner.invoke(cli, ["restore", str(archive)], env=fresh)
    assert back.exit_code == 0, back.output
    assert live.ownership.installation_id in back.output
    assert (home / "secret.key").is_file()
    assert _installation(make_settings(home, fresh_url)) == live.ownership.installation_id
