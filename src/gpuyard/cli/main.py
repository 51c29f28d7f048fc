"""The ``gpuyard`` command: the root group and the commands that run on the server's
machine (``serve``, ``keys``, ``dev-image``); the HTTP commands live beside it."""

from __future__ import annotations

import shutil
from pathlib import Path

import click

from gpuyard import __version__
from gpuyard.cli.accounts import accounts, invitations
from gpuyard.cli.backup import backup, restore
from gpuyard.cli.billing import billing
from gpuyard.cli.budgets import budget, credits
from gpuyard.cli.catalog import gpu_types
from gpuyard.cli.clusters import clusters
from gpuyard.cli.common import CliState, ErrorBoundaryGroup
from gpuyard.cli.env import env
from gpuyard.cli.hosts import hosts
from gpuyard.cli.keys import keys
from gpuyard.cli.orphans import orphans
from gpuyard.cli.quotas import quotas
from gpuyard.cli.resources import COMMANDS as RESOURCE_COMMANDS
from gpuyard.cli.secrets import secrets
from gpuyard.cli.serverless import endpoints, jobs
from gpuyard.cli.snapshots import snapshots
from gpuyard.cli.templates import templates
from gpuyard.cli.training import training
from gpuyard.cli.uninstall import uninstall

# gpuyard.runtimes.engines.devimage.DEFAULT_IMAGE (test_cli asserts they agree); not imported so
# the CLI starts fast.
DEV_IMAGE = "localhost/gpuyard/busybox:latest"


@click.group(cls=ErrorBoundaryGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--url", default=None, help="Server URL for HTTP commands.")
@click.option("--api-key", default=None, help="API key for HTTP commands.")
@click.option(
    "--json", "as_json", is_flag=True, help="Print raw JSON data (errors as a JSON object)."
)
@click.version_option(__version__, prog_name="gpuyard")
@click.pass_context
def cli(ctx: click.Context, url: str | None, api_key: str | None, as_json: bool) -> None:
    """gpuyard: a self-hostable GPU cloud.

    HTTP commands find the server and key in --url/--api-key, then GPUYARD_URL /
    GPUYARD_API_KEY, then $GPUYARD_HOME/credentials (written on the server's first start).
    """
    ctx.obj = CliState(url=url, api_key=api_key, json=as_json)


@cli.command("serve")
@click.option("--host", default=None, help="Bind address (default $GPUYARD_HOST or 127.0.0.1).")
@click.option("--port", type=int, default=None, help="Port (default $GPUYARD_PORT or 8000).")
def serve(host: str | None, port: int | None) -> None:
    """Run the API server and its reconciler until Ctrl-C / SIGTERM."""
    from gpuyard.cli.serve import run_server

    run_server(host, port)


@cli.command("ssh-gateway")
def ssh_gateway() -> None:
    """Run the SSH gateway alone (serve starts one itself unless GPUYARD_SSH_PORT=0)."""
    from gpuyard.cli.serve import configure_logging
    from gpuyard.edge.ssh_service import run_gateway
    from gpuyard.settings import Settings

    configure_logging()
    run_gateway(Settings())


@cli.command("dev-image")
@click.option(
    "--runtime",
    "runtime_cli",
    type=click.Choice(["podman", "docker"]),
    default=None,
    help="Engine CLI to import with (default: podman if installed, else docker).",
)
@click.option(
    "--name",
    default=None,
    help=f"Image name [default: {DEV_IMAGE}, or the Slurm node image with --slurm].",
)
@click.option(
    "--slurm",
    is_flag=True,
    help="Build the Slurm node image for training clusters instead (debootstrap, root).",
)
@click.option(
    "--web",
    is_flag=True,
    help="Build the web test image instead (HTTP/WebSocket test server on 8888; needs gcc).",
)
@click.option(
    "--serverless",
    is_flag=True,
    help="Build the serverless worker test image instead (Python and runpod-python; "
    "HANDLER=echo|stream|slow|async|concurrent).",
)
@click.option(
    "--wheel-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="With --serverless: the wheel cache [default: .cache/serverless-wheels].",
)
@click.option("--force", is_flag=True, help="Rebuild even if an image from this recipe exists.")
def dev_image(
    runtime_cli: str | None,
    name: str | None,
    slurm: bool,
    web: bool,
    serverless: bool,
    wheel_dir: Path | None,
    force: bool,
) -> None:
    """Build the offline busybox development image (or, with --slurm, the Slurm node
    image; with --web, the web test image; with --serverless, the serverless worker
    image); prints its name as the last line.

    An image already built from the same recipe is reused (said on stderr) unless
    --force is given."""
    if runtime_cli is None:
        runtime_cli = "podman" if shutil.which("podman") else "docker"
    if sum((slurm, web, serverless)) > 1:
        raise click.UsageError("--slurm, --web and --serverless build different images: pick one")
    if serverless:
        from gpuyard.devtools.serverless_image import (
            SERVERLESS_IMAGE,
            build_serverless_image,
            serverless_image_current,
        )

        name = name or SERVERLESS_IMAGE
        current = not force and serverless_image_current(name, runtime_cli, wheel_dir)
        _say_build(name, current, f"the wheel cache and {runtime_cli} import")
        click.echo(build_serverless_image(runtime_cli, name, force=force, wheel_dir=wheel_dir))
        return
    if web:
        from gpuyard.devtools.web_image import WEB_IMAGE, build_web_image, web_image_current

        name = name or WEB_IMAGE
        current = not force and web_image_current(name, runtime_cli)
        _say_build(name, current, f"gcc -static and {runtime_cli} import")
        click.echo(build_web_image(runtime_cli, name, force=force))
        return
    if slurm:
        from gpuyard.runtimes.slurm.image import (
            SLURM_IMAGE,
            build_slurm_image,
            slurm_image_current,
        )

        name = name or SLURM_IMAGE
        current = not force and slurm_image_current(name, runtime_cli)
        _say_build(name, current, f"debootstrap and {runtime_cli} import")
        click.echo(build_slurm_image(runtime_cli, name, force=force))
        return
    from gpuyard.runtimes.engines.devimage import build_dev_image, dev_image_current

    name = name or DEV_IMAGE
    current = not force and dev_image_current(runtime_cli, name)
    _say_build(name, current, f"{runtime_cli} import")
    click.echo(build_dev_image(runtime_cli, name, force=force))


def _say_build(name: str, reused: bool, how: str) -> None:
    """Tell stderr whether ``name`` is reused or built (stdout keeps only the name)."""
    if reused:
        click.echo(f"{name}: already present, reused", err=True)
    else:
        click.echo(f"building {name} with {how} ...", err=True)


cli.add_command(keys)
cli.add_command(env)
cli.add_command(clusters)
cli.add_command(gpu_types)
cli.add_command(hosts)
cli.add_command(billing)
cli.add_command(credits)
cli.add_command(budget)
cli.add_command(orphans)
cli.add_command(snapshots)
for command in RESOURCE_COMMANDS:
    cli.add_command(command)
cli.add_command(training)
cli.add_command(quotas)
cli.add_command(secrets)
cli.add_command(templates)
cli.add_command(endpoints)
cli.add_command(jobs)
cli.add_command(accounts)
cli.add_command(invitations)
cli.add_command(backup)
cli.add_command(restore)
cli.add_command(uninstall)


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="gpuyard")
