"""``gpuyard uninstall``: remove this installation from every host it knows. Run on the
server's machine, with the server's GPUYARD_* settings, while the server is stopped
(services/installation/uninstall.py does the work)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from typing import TYPE_CHECKING

import click
import httpx

from gpuyard.cli.output import human_bytes, print_table

if TYPE_CHECKING:
    from gpuyard.core.ownership import Ownership
    from gpuyard.runtimes.engines.engine import Engine, EngineVolume
    from gpuyard.services.installation.uninstall import HostRemoval


@click.command("uninstall")
@click.option(
    "--delete-volumes",
    is_flag=True,
    help="Delete this installation's volumes too (their data is lost); listed first.",
)
@click.option("--yes", is_flag=True, help="Do not ask before deleting volumes.")
@click.option("--purge-home", is_flag=True, help="Remove GPUYARD_HOME too (database, keys).")
@click.option(
    "--force", is_flag=True, help="Go on even though a server answers at this home's address."
)
@click.option("--json", "as_json", is_flag=True, help="Print what was removed as JSON.")
def uninstall(
    delete_volumes: bool, yes: bool, purge_home: bool, force: bool, as_json: bool
) -> None:
    """Remove everything of this installation (what carries its installation id) on
    every host it knows: containers, networks, host firewall chains, and with
    --delete-volumes its volumes. Other installations' objects are never touched. The
    home directory is kept unless --purge-home. Exits 1 if a host could not be
    cleaned (it is named, with why)."""
    from gpuyard.cli.serve import connectable_url
    from gpuyard.core.errors import RuntimeFailure
    from gpuyard.edge.caddy import CaddyProcess
    from gpuyard.edge.proxy_resolver import ResolverProcess
    from gpuyard.runtimes.engines.engine import Engine, EnginePolicy
    from gpuyard.runtimes.engines.url import detect_engine_url, is_local_engine
    from gpuyard.runtimes.fleet import HostEngine
    from gpuyard.runtimes.hosts.runtimes import (
        HostEngineRuntime,
        host_runtime_factory,
        local_volume_images,
    )
    from gpuyard.services.installation.uninstall import (
        installation_of,
        owned_volumes,
        uninstall_hosts,
    )
    from gpuyard.settings import Settings

    settings = Settings()
    url = connectable_url(settings)
    if not force and _answers(url):
        raise click.ClickException(
            f"a gpuyard server answers at {url} (this home's address): stop it first, "
            "or pass --force if it is not this installation's"
        )
    owner, hosts = installation_of(settings.effective_database_url)
    local_url = detect_engine_url(settings.engine_url)
    policy = EnginePolicy(manage_host_firewall=is_local_engine(local_url))
    # With the server's volume images, so that a deleted sized volume's image file
    # goes with it (on this machine and on every host gpuyard runs commands on).
    factory = host_runtime_factory(
        settings.home,
        policy,
        settings.remote_engine_timeout_s,
        volume_image_dir=settings.volume_image_dir,
    )
    images = local_volume_images(local_url, settings.volume_image_dir)
    closers: list[Callable[[], None]] = []

    def local() -> Engine:
        return Engine(local_url, owner=owner, policy=policy, volume_images=images)

    def remote(i: int) -> Callable[[], Engine]:
        h = hosts[i]

        def make() -> Engine:
            runtime = factory(HostEngine(i + 2, h.name, h.engine_url, h.tls_dir))
            assert isinstance(runtime, HostEngineRuntime)
            closers.append(runtime.close)
            # Starts the SSH tunnel of an ssh:// host and pings the engine through it.
            problem = runtime.available()
            if problem is not None:
                raise RuntimeFailure(problem)
            return runtime.engine

        return make

    made: dict[str, Engine] = {}

    def cached(name: str, connect: Callable[[], Engine]) -> Callable[[], Engine]:
        def get() -> Engine:
            if name not in made:
                made[name] = connect()
            return made[name]

        return get

    targets = [("local", cached("local", local))]
    targets += [(h.name, cached(h.name, remote(i))) for i, h in enumerate(hosts)]
    try:
        if delete_volumes and not yes:
            _confirm_volumes(targets, owner, owned_volumes)
        removed = uninstall_hosts(targets, owner, delete_volumes=delete_volumes)
    finally:
        for close in closers:
            close()
    # The proxy this installation started is kept across server restarts: stop it, and
    # the resolver it routes by.
    CaddyProcess(settings.home / "caddy").stop()
    ResolverProcess(settings.home / "caddy").stop()
    failed = [r for r in removed if r.error]
    if purge_home and not failed:
        shutil.rmtree(settings.home, ignore_errors=True)
    if as_json:
        body = {
            "installation_id": owner.installation_id,
            "hosts": [r.as_json() for r in removed],
            "home_removed": purge_home and not failed,
        }
        click.echo(json.dumps(body, indent=2))
    else:
        _print_report(owner.installation_id, removed, purge_home and not failed)
    if failed:
        for r in failed:
            click.echo(f"error: host {r.host}: {r.error}", err=True)
        if purge_home:
            click.echo("the home was kept: a host still holds objects of it", err=True)
        raise SystemExit(1)


def _answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


def _confirm_volumes(
    targets: list[tuple[str, Callable[[], Engine]]],
    owner: Ownership,
    lister: Callable[[Engine], list[EngineVolume]],
) -> None:
    """List the volumes that would be deleted, per host, and ask; abort on no."""
    from gpuyard.core.errors import GpuyardError

    rows: list[list[object]] = []
    for name, connect in targets:
        try:
            engine = connect()
            engine.bind(owner)
            rows += [[name, v.name, human_bytes(v.size_bytes)] for v in lister(engine)]
        except GpuyardError as exc:
            rows.append([name, f"(not listed: {exc.message})", "-"])
    if not rows:
        return
    print_table(["HOST", "VOLUME", "SIZE"], rows, "")
    click.confirm(f"delete these {len(rows)} volumes and their data?", abort=True, err=True)


def _print_report(installation_id: str, removed: list[HostRemoval], home_removed: bool) -> None:
    click.echo(f"installation {installation_id}:")
    for h in removed:
        click.echo(f"host {h.host}: {'FAILED: ' + h.error if h.error else 'clean'}")
        for label, names in (
            ("containers", h.containers),
            ("networks", h.networks),
            ("volumes deleted", h.volumes),
            ("volumes kept", h.volumes_kept),
            ("firewall chains", h.firewall_chains),
        ):
            click.echo(f"  {label} ({len(names)}): {', '.join(names) or '-'}")
    click.echo("home removed" if home_removed else "home kept")
