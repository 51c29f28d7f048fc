"""``gpuyard hosts``: the fleet (needs an admin key). The table of hosts, and
``add``, ``get``, ``cordon``, ``uncordon``, ``drain``, ``delete`` and ``key`` (the SSH public key
to install on hosts reached over ``ssh://``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import click

from gpuyard.cli.client import JSON
from gpuyard.cli.common import api_options, make_call
from gpuyard.cli.output import cell, key_values, print_json, print_table, table

# How often ``hosts add --wait`` asks whether the first heartbeat has answered.
POLL_S = 0.5


def limits_cell(host: JSON) -> str:
    """``enforced``, or ``NOT ENFORCED`` with the host's note: an operator must see at a
    glance that tenants on this host are not held to their CPU and memory."""
    if host.get("enforces_limits", True):
        return "enforced"
    note = host.get("limits_note")
    return f"NOT ENFORCED ({note})" if note else "NOT ENFORCED"


def _gpus_cell(host: JSON) -> str:
    """``free/total TYPE`` per GPU type, and whether they were declared."""
    cap = host.get("capacity") or {}
    total: dict[str, int] = (cap.get("total") or {}).get("gpus") or {}
    free: dict[str, int] = (cap.get("free") or {}).get("gpus") or {}
    source = (host.get("inventory") or {}).get("gpus", "discovered")
    if not total:
        return f"none ({source})"
    by_type = ", ".join(f"{free.get(t, 0)}/{n} {t}" for t, n in sorted(total.items()))
    return f"{by_type} ({source})"


def _free_of(host: JSON, field: str, unit: str = "") -> str:
    cap = host.get("capacity") or {}
    free = (cap.get("free") or {}).get(field)
    total = (cap.get("total") or {}).get(field)
    return f"{cell(free)}/{cell(total)}{unit}"


def _engine_cell(host: JSON) -> str:
    name, version = host.get("engine_name"), host.get("engine_version")
    url = host.get("engine_url") or "default"
    return f"{name} {version or ''} {url}".replace("  ", " ") if name else url


def _ago(stamp: Any, now: datetime | None = None) -> str:
    """``12s ago`` (or minutes, hours) for an ISO time; ``never`` for none."""
    if not isinstance(stamp, str):
        return "never"
    try:
        then = datetime.fromisoformat(stamp)
    except ValueError:
        return stamp
    if then.tzinfo is None:
        then = then.replace(tzinfo=UTC)
    seconds = max(0, int(((now or datetime.now(UTC)) - then).total_seconds()))
    if seconds < 120:
        return f"{seconds}s ago"
    if seconds < 7200:
        return f"{seconds // 60}m ago"
    return f"{seconds // 3600}h ago"


def _reach_cell(host: JSON) -> str:
    reach = str(host.get("reachability", "unknown"))
    error = host.get("heartbeat_error")
    return f"{reach} ({error})" if reach != "reachable" and error else reach


@click.group("hosts", invoke_without_command=True)
@api_options
@click.pass_context
def hosts(ctx: click.Context, url: str | None, api_key: str | None, as_json: bool) -> None:
    """The fleet: every host with status, reachability, capacity and what is free
    (needs an admin key)."""
    if ctx.invoked_subcommand is not None:
        return
    call = make_call(url, api_key, as_json)
    with call.client as client:
        data = client.hosts()
    if call.as_json:
        print_json(data)
        return
    click.echo(f"installation: {data.get('installation_id') or 'unknown'}")
    rows = [
        [
            h["id"],
            h.get("name"),
            h.get("status"),
            _reach_cell(h),
            h.get("location"),
            h.get("cloud_type"),
            _gpus_cell(h),
            _free_of(h, "vcpus"),
            _free_of(h, "memory_gb", "G"),
            _free_of(h, "disk_gb", "G"),
            limits_cell(h),
            _engine_cell(h),
            _ago(h.get("last_heartbeat_at")),
        ]
        for h in data.get("hosts", [])
    ]
    print_table(
        ["ID", "NAME", "STATUS", "REACHABILITY", "LOCATION", "CLOUD", "GPUS FREE/TOTAL",
         "VCPU FREE", "MEM FREE", "DISK FREE", "LIMITS", "ENGINE", "LAST HEARTBEAT"],
        rows,
        "no hosts",
    )  # fmt: skip


def _describe(host: JSON) -> str:
    """A host as a key/value block, then what runs on it."""
    inv = host.get("inventory") or {}
    block = key_values(
        [
            ("id", host.get("id")),
            ("name", host.get("name")),
            ("status", host.get("status")),
            ("reachability", _reach_cell(host)),
            ("last heartbeat", _ago(host.get("last_heartbeat_at"))),
            ("engine", _engine_cell(host)),
            ("address", host.get("address")),
            ("client address", host.get("client_address") or "(its address)"),
            ("location", host.get("location")),
            ("cloud", host.get("cloud_type")),
            ("local", host.get("is_local")),
            ("gpus", _gpus_cell(host)),
            ("vcpus", f"{_free_of(host, 'vcpus')} free ({inv.get('vcpus')})"),
            ("memory", f"{_free_of(host, 'memory_gb', ' GB')} free ({inv.get('memory_gb')})"),
            ("disk", f"{_free_of(host, 'disk_gb', ' GB')} free ({inv.get('disk_gb')})"),
            ("cuda", host.get("cuda_version") or "unknown"),
            ("limits", limits_cell(host)),
        ]
    )
    clusters = host.get("clusters") or []
    if not clusters:
        return block + "\nclusters: none"
    rows = [
        [c.get("id"), c.get("kind"), c.get("name"), c.get("status"),
         f"{c.get('gpus_held')}/{c.get('gpu_count')}"]
        for c in clusters
    ]  # fmt: skip
    return block + "\n\n" + table(["ID", "KIND", "NAME", "STATUS", "GPUS HELD"], rows)


def _inventory_found(host: JSON) -> str:
    """What the first heartbeat found (or what was declared), in one line."""
    inv = host.get("inventory") or {}
    parts = [f"engine {_engine_cell(host)}"]
    parts.append(f"{host.get('vcpus')} vCPUs ({inv.get('vcpus')})")
    parts.append(f"{host.get('memory_gb')} GB memory ({inv.get('memory_gb')})")
    parts.append(f"{host.get('disk_gb')} GB disk ({inv.get('disk_gb')})")
    parts.append(f"GPUs: {_gpus_cell(host)}")
    return ", ".join(parts)


def _discovered(host: JSON) -> bool:
    """Whether the heartbeat has filled in what was not declared (the engine's
    version is written with the discovered inventory)."""
    inv = host.get("inventory") or {}
    if all(v == "declared" for v in inv.values()):
        return True
    return bool(host.get("engine_version"))


def wait_reachable(
    get: Callable[[], JSON],
    timeout_s: float,
    *,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[JSON, bool]:
    """Poll ``get`` until the host is reachable and its inventory discovered, or
    ``timeout_s`` passes. Returns the last answer and whether it became reachable."""
    deadline = clock() + timeout_s
    while True:
        host = get()
        reachable = host.get("reachability") == "reachable"
        if (reachable and _discovered(host)) or clock() >= deadline:
            return host, reachable
        sleep(POLL_S)


@hosts.command("add")
@click.argument("name")
@click.option(
    "--engine",
    "engine_url",
    required=True,
    help="unix:///path.sock, ssh://user@host[:port][/socket] or tcp://host:port.",
)
@click.option(
    "--address",
    default=None,
    help="Where users reach published ports (default: the engine URL's host).",
)
@click.option(
    "--client-address",
    default=None,
    help="Where clients reach published ports when not at --address (IP or DNS name).",
)
@click.option("--location", default=None, help="Location / data centre (default: the server's).")
@click.option(
    "--cloud-type",
    type=click.Choice(["secure", "community"], case_sensitive=False),
    default=None,
    help="secure (default) or community.",
)
@click.option(
    "--gpus",
    default=None,
    help='Declared GPUs, "NVIDIA RTX A6000:4[,TYPE:N]" (default: discovered).',
)
@click.option("--vcpus", type=click.IntRange(min=1), default=None, help="Declared vCPUs.")
@click.option("--memory-gb", type=click.IntRange(min=1), default=None, help="Declared memory.")
@click.option("--disk-gb", type=click.IntRange(min=1), default=None, help="Declared disk.")
@click.option("--cuda-version", default=None, metavar="X.Y",
              help="Declared CUDA driver version (default: discovered by nvidia-smi).")  # fmt: skip
@click.option(
    "--tls-dir",
    default=None,
    help="tcp:// only: directory with ca.pem, cert.pem, key.pem on the server.",
)
@click.option(
    "--wait/--no-wait",
    default=True,
    show_default=True,
    help="Wait for the first heartbeat to answer.",
)
@click.option(
    "--wait-timeout",
    type=click.FloatRange(min=0),
    default=30.0,
    show_default=True,
    help="Seconds to wait with --wait.",
)
@api_options
def add(
    name: str,
    engine_url: str,
    address: str | None,
    client_address: str | None,
    location: str | None,
    cloud_type: str | None,
    gpus: str | None,
    vcpus: int | None,
    memory_gb: int | None,
    disk_gb: int | None,
    cuda_version: str | None,
    tls_dir: str | None,
    wait: bool,
    wait_timeout: float,
    url: str | None,
    api_key: str | None,
    as_json: bool,
) -> None:
    """Add host NAME reached through its engine at --engine. For ssh:// hosts, first
    add the key of `gpuyard hosts key` to the user's ~/.ssh/authorized_keys there."""
    body: dict[str, Any] = {"name": name, "engine_url": engine_url}
    optional = {
        "address": address,
        "client_address": client_address,
        "location": location,
        "cloud_type": cloud_type.lower() if cloud_type else None,
        "gpus": gpus,
        "vcpus": vcpus,
        "memory_gb": memory_gb,
        "disk_gb": disk_gb,
        "cuda_version": cuda_version,
        "engine_tls_dir": tls_dir,
    }
    body.update({k: v for k, v in optional.items() if v is not None})
    call = make_call(url, api_key, as_json)
    with call.client as client:
        host = client.add_host(body)
        host_id = int(host["id"])
        reachable = host.get("reachability") == "reachable"
        if wait:
            host, reachable = wait_reachable(lambda: client.get_host(host_id), wait_timeout)
    if call.as_json:
        print_json(host)
    else:
        click.echo(f"added host {host_id} ({host.get('name')}), engine {host.get('engine_url')}")
        if reachable:
            click.echo(f"reachable: {_inventory_found(host)}")
        elif wait:
            why = host.get("heartbeat_error") or "no heartbeat has answered yet"
            click.echo(f"not reachable after {wait_timeout:g} s: {why}")
    if wait and not reachable:
        click.echo(
            f"error: host {host_id} was added but its engine does not answer; see "
            f"`gpuyard hosts get {host_id}` (it is retried every heartbeat)",
            err=True,
        )
        raise SystemExit(1)


@hosts.command("set-cuda")
@click.argument("host_id", type=click.IntRange(min=1))
@click.argument("version", metavar="X.Y|none")
@api_options
def set_cuda(
    host_id: int, version: str, url: str | None, api_key: str | None, as_json: bool
) -> None:
    """Declare host HOST_ID's CUDA driver version (clusters' min_cuda_version is
    compared with it), for hosts whose GPUs nvidia-smi cannot see; `none`: back to
    what is discovered."""
    declared = None if version.lower() == "none" else version
    call = make_call(url, api_key, as_json)
    with call.client as client:
        host = client.update_host(host_id, {"cuda_version": declared})
    if call.as_json:
        print_json(host)
        return
    click.echo(f"host {host_id}: CUDA driver version {host.get('cuda_version') or 'unknown'}")


@hosts.command("get")
@click.argument("host_id", type=click.IntRange(min=1))
@api_options
def get(host_id: int, url: str | None, api_key: str | None, as_json: bool) -> None:
    """One host: engine, reachability, capacity and the clusters on it."""
    call = make_call(url, api_key, as_json)
    with call.client as client:
        host = client.get_host(host_id)
    if call.as_json:
        print_json(host)
        return
    click.echo(_describe(host))


@hosts.command("set")
@click.argument("host_id", type=click.IntRange(min=1))
@click.option(
    "--client-address",
    default=None,
    help="Where clients reach the host's published ports (IP or DNS name); '' for its own address.",
)
@api_options
def set_settings(
    host_id: int, client_address: str | None, url: str | None, api_key: str | None, as_json: bool
) -> None:
    """Change a host's settings; what is not given stays as it is."""
    body: dict[str, Any] = {}
    if client_address is not None:
        body["client_address"] = client_address or None
    if not body:
        raise click.UsageError("nothing to change: give --client-address")
    call = make_call(url, api_key, as_json)
    with call.client as client:
        host = client.update_host(host_id, body)
    if call.as_json:
        print_json(host)
        return
    shown = host.get("client_address") or f"its address ({host.get('address')})"
    click.echo(f"host {host['id']} ({host.get('name')}): clients reach it at {shown}")


def _status_command(name: str, verb: str, doc: str) -> click.Command:
    @click.argument("host_id", type=click.IntRange(min=1))
    @api_options
    def command(host_id: int, url: str | None, api_key: str | None, as_json: bool) -> None:
        call = make_call(url, api_key, as_json)
        with call.client as client:
            host = getattr(client, f"{name}_host")(host_id)
        if call.as_json:
            print_json(host)
            return
        click.echo(f"host {host['id']} ({host.get('name')}) {verb}: status {host.get('status')}")

    command.__doc__ = doc
    return hosts.command(name)(command)


cordon = _status_command(
    "cordon", "cordoned", "Place nothing new on a host; what runs there stays."
)
uncordon = _status_command(
    "uncordon", "uncordoned", "Take placements on a host again (ends a drain too)."
)


@hosts.command("drain")
@click.argument("host_id", type=click.IntRange(min=1))
@api_options
def drain(host_id: int, url: str | None, api_key: str | None, as_json: bool) -> None:
    """Cordon a host and move its clusters to other hosts (running ones are stopped and
    started elsewhere; stopped ones have their volume moved) and its training workers
    (recreated on other hosts of their location)."""
    call = make_call(url, api_key, as_json)
    with call.client as client:
        data = client.drain_host(host_id)
    if call.as_json:
        print_json(data)
        return
    report = data["drain"]
    click.echo(f"host {host_id} draining")
    for cid in report["stopping"]:
        click.echo(f"  {cid}: stopping, then starting on another host")
    for cid in report["moving"]:
        click.echo(f"  {cid}: moving its volume to another host")
    for item in report["cannot_move"]:
        click.echo(f"  {item['cluster_id']}: cannot move now: {item['reason']}")
    training = report.get("training_nodes") or {}
    for node in training.get("moving", []):
        click.echo(f"  training node {node['name']}: recreated on host {node['to_host_id']}")
    for node in training.get("cannot_move", []):
        click.echo(f"  training node {node['name']}: cannot move now: {node['reason']}")


@hosts.command("delete")
@click.argument("host_id", type=click.IntRange(min=1))
@api_options
def delete(host_id: int, url: str | None, api_key: str | None, as_json: bool) -> None:
    """Remove a host with nothing left on it (terminate or drain its clusters first)."""
    call = make_call(url, api_key, as_json)
    with call.client as client:
        data = client.delete_host(host_id)
    if call.as_json:
        print_json(data)
        return
    click.echo(f"deleted host {data.get('id')} ({data.get('name')})")


@hosts.command("key")
@api_options
def key(url: str | None, api_key: str | None, as_json: bool) -> None:
    """Print the installation's SSH public key: add it to ~/.ssh/authorized_keys of the
    user named in a host's ssh:// engine URL."""
    call = make_call(url, api_key, as_json)
    with call.client as client:
        data = client.host_ssh_key()
    if call.as_json:
        print_json(data)
        return
    click.echo(data.get("public_key"))
