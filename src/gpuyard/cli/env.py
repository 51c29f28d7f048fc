"""``gpuyard env``: the shell lines that point the CLI, curl and the SDKs at the local
server, for ``eval "$(gpuyard env)"``.

The key is the one the server saved in ``$GPUYARD_HOME/credentials`` on its first
start; the URL is where this machine reaches the server under the current
``GPUYARD_HOST`` / ``GPUYARD_PORT`` settings. With no credentials file in the home the
command fails (exit status 1, message on stderr) rather than print an empty key.
"""

from __future__ import annotations

import shlex

import click

from gpuyard.cli.config import credentials_path, read_credentials


@click.command("env")
def env() -> None:
    """Print `export GPUYARD_URL=... GPUYARD_API_KEY=...` for this GPUYARD_HOME."""
    from gpuyard.services.installation.bootstrap import client_url
    from gpuyard.settings import Settings

    path = credentials_path()
    key = read_credentials(path).get("api_key")
    if not key:
        raise click.ClickException(
            f"no API key in {path}: start the server with this GPUYARD_HOME first "
            "(`make run` or `gpuyard serve`), or set GPUYARD_HOME to the server's home"
        )
    url = client_url(Settings())
    click.echo(f"export GPUYARD_URL={shlex.quote(url)} GPUYARD_API_KEY={shlex.quote(key)}")
