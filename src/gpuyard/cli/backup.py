"""``gpuyard backup`` and ``gpuyard restore``: run on the server's machine, with the
server's GPUYARD_* settings (services/installation/backup.py)."""

from __future__ import annotations

from pathlib import Path

import click


@click.command("backup")
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path))
def backup(path: Path) -> None:
    """Write a backup of this installation to PATH (a new file, 0600) while it runs:
    the database (a consistent copy) with the secret key, the snapshot password, the
    SSH keys and known hosts, the credentials and the host id. Snapshot data is not in
    it (back the restic repository up with restic)."""
    from gpuyard.services.installation.backup import backup as make_backup
    from gpuyard.settings import Settings

    done = make_backup(Settings(), path)
    click.echo(
        f"backed up installation {done.installation_id} ({done.database}, "
        f"{len(done.files)} files) to {done.path}"
    )


@click.command("restore")
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
def restore(path: Path) -> None:
    """Bring back the installation of backup PATH into an empty GPUYARD_HOME (and an
    empty database). Start `gpuyard serve` next: it adopts the backup's clusters on
    their hosts; containers made after the backup are stopped and kept, their volumes
    quarantined (`gpuyard orphans`). Nothing on any host is deleted."""
    from gpuyard.services.installation.backup import restore as bring_back
    from gpuyard.settings import Settings

    settings = Settings()
    done = bring_back(settings, path)
    click.echo(
        f"restored installation {done.installation_id} as of {done.created_at} into "
        f"{settings.home}; start it with `gpuyard serve`"
    )
