"""``gpuyard clusters ...``: create, list, inspect and drive clusters over REST v1."""

from __future__ import annotations

import json
import time
from typing import Any

import click

from gpuyard.cli.client import JSON, GpuyardClient
from gpuyard.cli.cluster_logs import logs
from gpuyard.cli.common import api_options, make_call
from gpuyard.cli.output import Progress, cell, key_values, print_events, print_json, print_table

POLL_INTERVAL_S = 0.5
IN_PROGRESS = {"pending", "starting", "stopping", "terminating"}
FAILED = {"error", "stopped", "terminated"}
PROTOCOLS = ("tcp", "udp", "http")


# -- option parsing ---------------------------------------------------------------------


def parse_env(values: tuple[str, ...]) -> dict[str, str]:
    """``KEY=VAL`` pairs (VAL may be empty or contain ``=``) into a dict."""
    env: dict[str, str] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="--env")
        env[key] = value
    return env


def env_with_secrets(plain: tuple[str, ...], secret: tuple[str, ...]) -> dict[str, object]:
    """``--env`` and ``--secret-env`` as one env object: secret values sent marked secret
    (stored sealed, shown masked)."""
    env: dict[str, object] = dict(parse_env(plain))
    for key, value in parse_env(secret).items():
        env[key] = {"value": value, "secret": True}
    return env


def parse_port(spec: str) -> JSON:
    """INTERNAL[:EXTERNAL][/PROTO[,public]] into a PortSpec body; EXTERNAL 0 or absent
    asks the server to assign one, PROTO is tcp (default), udp or http; ``,public``
    lets anybody through the HTTP proxy (http ports are private by default)."""
    text, _, proto = spec.partition("/")
    proto, _, flag = proto.partition(",")
    proto = (proto or "tcp").lower()
    if flag and (flag.lower() != "public" or proto != "http"):
        raise click.BadParameter(
            f"{spec!r}: only an http port can be ',public'", param_hint="--port"
        )
    if proto not in PROTOCOLS:
        raise click.BadParameter(
            f"{spec!r}: protocol must be one of {', '.join(PROTOCOLS)}", param_hint="--port"
        )
    internal, _, external = text.partition(":")
    try:
        port: JSON = {"internal_port": int(internal), "protocol": proto}
        if flag:
            port["visibility"] = "public"
        if external:
            port["external_port"] = int(external)
    except ValueError:
        raise click.BadParameter(
            f"{spec!r} is not INTERNAL[:EXTERNAL][/tcp|udp|http]", param_hint="--port"
        ) from None
    return port


# -- human views ------------------------------------------------------------------------


def _gpus(c: JSON) -> str:
    count = c.get("gpu_count") or 0
    if not count:
        return "none"
    name = c.get("gpu_display_name") or c.get("gpu_type") or "GPU"
    indices = c.get("gpu_indices") or []
    where = f" (indices {','.join(str(i) for i in indices)})" if indices else ""
    return f"{count} x {name}{where}"


def _ports(c: JSON) -> str | None:
    net = c.get("network") or {}
    items = net.get("ports") or c.get("ports") or []
    out = []
    for p in items:
        ext = p.get("address") or p.get("external_port") or "unassigned"
        via = f" ({p.get('visibility', 'private')}: {p['proxy_url']})" if p.get("proxy_url") else ""
        out.append(f"{p['internal_port']}/{p['protocol']} -> {ext}{via}")
    return ", ".join(out) or None


def show_cluster(c: JSON) -> None:
    """A cluster as aligned ``label: value`` lines."""
    host = c.get("host") or {}
    net = c.get("network") or {}
    ssh = (net.get("ssh_connection") or {}).get("connection_string")
    progress = c.get("startup_progress")
    cost = c.get("cost") or {}
    rate = cost.get("hourly_rate")
    pairs: list[tuple[str, Any]] = [
        ("id", c.get("id")),
        ("name", c.get("name") or "-"),
        ("status", c.get("status")),
        (
            "progress",
            f"{progress['percentage']}% {progress['current_step']}" if progress else None,
        ),
        ("error", c.get("error_message")),
        ("image", c.get("docker_image")),
        ("entrypoint", _shown_entrypoint(c.get("docker_entrypoint"))),
        ("args", c.get("docker_args") or None),
        ("min cuda", c.get("min_cuda_version")),
        ("gpus", _gpus(c)),
        ("cpu", f"{c.get('cpu_cores')} vCPU"),
        ("memory", f"{c.get('memory_gb')} GB"),
        ("disk", f"{c.get('container_disk_gb')} GB container"),
        (
            "volume",
            f"{c.get('volume_gb')} GB at {c.get('volume_mount_path')}"
            if c.get("volume_gb")
            else "none",
        ),
        ("env", ", ".join(f"{k}={v}" for k, v in (c.get("env") or {}).items()) or None),
        ("ports", _ports(c)),
        ("url", net.get("proxy_url")),
        ("ssh", ssh),
        (
            "host",
            f"{host.get('name')} ({host.get('location')}, gpus {host.get('gpu_source')})"
            if host
            else None,
        ),
        ("cost", f"${cell(rate)}/h" if rate is not None else None),
        ("actions", ", ".join(c.get("actions") or []) or "none"),
        ("created", c.get("created_at")),
    ]
    click.echo(key_values(pairs))


def emit(c: JSON, as_json: bool) -> None:
    if as_json:
        print_json(c)
    else:
        show_cluster(c)


# -- waiting ----------------------------------------------------------------------------


def wait_running(client: GpuyardClient, cluster_id: str, timeout_s: float) -> tuple[JSON, bool]:
    """Poll ``GET /v1/clusters/{id}`` every 0.5 s, showing progress on stderr, until the
    cluster is running (returns it and True), settles in error/stopped/terminated (returns
    it and False) or ``timeout_s`` passes (returns the last view and False). A stopped
    cluster whose desired status is running (a start requested while it stopped) is
    still on its way."""
    return wait_status(client, cluster_id, timeout_s, "running")


def _settled_otherwise(c: JSON, target: str) -> bool:
    """Whether ``c`` rests in a status other than ``target`` (waiting on is futile)."""
    status = str(c.get("status"))
    if target == "stopped":
        return status in {"error", "terminated", "running"}
    pending_start = status == "stopped" and c.get("desired_status") == "running"
    return status in FAILED and not pending_start


def wait_status(
    client: GpuyardClient, cluster_id: str, timeout_s: float, target: str
) -> tuple[JSON, bool]:
    """Poll until the cluster is ``target`` (running or stopped; returns it and True),
    rests in another status (see :func:`_settled_otherwise`) or ``timeout_s`` passes
    (the last view and False), showing progress on stderr."""
    progress = Progress()
    deadline = time.monotonic() + timeout_s
    pct = 0
    try:
        while True:
            c = client.get_cluster(cluster_id)
            status = str(c.get("status"))
            sp = c.get("startup_progress") or {}
            pct = int(sp.get("percentage", pct))
            if status == target:
                progress.update(status, 100, "Ready" if target == "running" else "Stopped")
                return c, True
            if _settled_otherwise(c, target):
                progress.update(status, pct, "failed" if status == "error" else status)
                return c, False
            progress.update(status, pct, str(sp.get("current_step") or status))
            if time.monotonic() >= deadline:
                return c, False
            time.sleep(POLL_INTERVAL_S)
    finally:
        progress.finish()


def finish_wait(
    client: GpuyardClient,
    cluster_id: str,
    timeout_s: float,
    as_json: bool,
    target: str = "running",
) -> None:
    """Wait (see :func:`wait_status`) until ``target``, print the cluster, and exit 1
    unless it got there."""
    c, ok = wait_status(client, cluster_id, timeout_s, target)
    emit(c, as_json)
    if ok:
        return
    status = c.get("status")
    if _settled_otherwise(c, target):
        why = c.get("error_message") or c.get("last_status_change") or "no reason recorded"
        click.echo(f"error: cluster {cluster_id} is {status}: {why}", err=True)
    else:
        click.echo(
            f"error: cluster {cluster_id} is still {status} after {timeout_s:.0f} s", err=True
        )
    raise SystemExit(1)


# -- commands ---------------------------------------------------------------------------

wait_option = click.option(
    "--wait", is_flag=True, help="Poll until running; exit 1 if it fails or times out."
)
timeout_option = click.option(
    "--timeout",
    type=click.FloatRange(min=1),
    default=600.0,
    show_default=True,
    help="Seconds --wait waits.",
)
env_option = click.option(
    "--env", "env", multiple=True, metavar="KEY=VAL", help="Environment variable (repeatable)."
)
port_option = click.option(
    "--port",
    "ports",
    multiple=True,
    metavar="INTERNAL[:EXTERNAL][/PROTO[,public]]",
    help=(
        "Port to expose (repeatable). INTERNAL is the container's port; EXTERNAL the "
        "host's (absent or 0: assigned); PROTO tcp (default), udp or http. An http port "
        "is private (only via the proxy with your key) unless ',public' is added. "
        "Examples: 22, 8080:30080, 5353/udp, 8888/http, 8888/http,public."
    ),
)


@click.group("clusters")
def clusters() -> None:
    """Create, list, inspect, start, stop and terminate clusters."""


def _entrypoint(value: str | None) -> list[str] | None:
    """``--entrypoint``'s JSON list of strings (None: not given)."""
    if value is None:
        return None
    try:
        parsed = json.loads(value)
    except ValueError:
        parsed = None
    if not isinstance(parsed, list) or not all(isinstance(v, str) for v in parsed):
        raise click.BadParameter('a JSON list of strings, e.g. \'["/bin/sh", "-c"]\'')
    return parsed


def _shown_entrypoint(value: Any) -> str | None:
    """A cluster's entrypoint for the key/value block (None: the image's own)."""
    if value is None:
        return None
    return json.dumps(value) if value else "[] (none)"


@clusters.command("create")
@click.option("--name", default="", help="Display name.")
@click.option("--gpu-type", default=None, help='GPU type id, e.g. "NVIDIA RTX A6000".')
@click.option(
    "--gpu-count", type=click.IntRange(0, 64), default=None, help="GPUs (0 for a CPU-only cluster)."
)
@click.option("--cpu-cores", type=click.IntRange(min=1), default=None, help="vCPUs.")
@click.option("--memory-gb", type=click.IntRange(min=1), default=None, help="Memory in GB.")
@click.option(
    "--container-disk-gb",
    type=click.IntRange(min=1),
    default=None,
    help="Container disk in GB (lost on stop).",
)
@click.option(
    "--volume-gb",
    type=click.IntRange(min=0),
    default=None,
    help="Persistent volume in GB (0: none).",
)
@click.option("--volume-mount-path", default=None, help="Default /workspace.")
@click.option("--image", default=None, help="Container image (required without --template).")
@click.option("--template", "template_id", default=None, metavar="ID",
              help="Start from this template (templates); the other options win.")  # fmt: skip
@click.option("--args", "docker_args", default=None, help="Command override.")
@click.option("--entrypoint", "entrypoint", default=None, metavar="JSON",
              help="ENTRYPOINT override: a JSON list of strings ([]: none).")  # fmt: skip
@click.option("--min-cuda-version", default=None, metavar="X.Y",
              help="Only hosts whose CUDA driver version is at least this.")  # fmt: skip
@env_option
@port_option
@click.option(
    "--cloud-type",
    type=click.Choice(["SECURE", "COMMUNITY"], case_sensitive=False),
    help="Cloud type of the host to place on.",
)
@click.option(
    "--project-id",
    type=int,
    default=None,
    help="Project id (default: your account's default project).",
)
@click.option(
    "--bid",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Spot: bid per GPU-hour (USD); the cluster may be preempted by higher bids.",
)
@click.option("--snapshot", "snapshot_id", default=None, metavar="SNAPSHOT",
              help="A clone: the volume starts with this snapshot's data.")  # fmt: skip
@click.option("--network-volume", "network_volume_id", default=None, metavar="ID",
              help="Mount this network volume at the mount path instead of a volume.")  # fmt: skip
@click.option("--registry-auth", "registry_auth_id", type=int, default=None, metavar="ID",
              help="Pull the image with these registry credentials (registry-auths).")  # fmt: skip
@wait_option
@timeout_option
@api_options
def create(
    name: str,
    gpu_type: str | None,
    gpu_count: int | None,
    cpu_cores: int | None,
    memory_gb: int | None,
    container_disk_gb: int | None,
    volume_gb: int | None,
    volume_mount_path: str | None,
    image: str | None,
    template_id: str | None,
    docker_args: str | None,
    entrypoint: str | None,
    min_cuda_version: str | None,
    env: tuple[str, ...],
    ports: tuple[str, ...],
    cloud_type: str | None,
    project_id: int | None,
    bid: float | None,
    snapshot_id: str | None,
    network_volume_id: str | None,
    registry_auth_id: int | None,
    wait: bool,
    timeout: float,
    url: str | None,
    api_key: str | None,
    as_json: bool,
) -> None:
    """Create a cluster (placed at once, started by the server)."""
    if image is None and template_id is None:
        raise click.UsageError("give --image or --template")
    body: JSON = {"name": name}
    optional: dict[str, Any] = {
        "docker_image": image,
        "template_id": template_id,
        "gpu_type": gpu_type,
        "gpu_count": gpu_count,
        "cpu_cores": cpu_cores,
        "memory_gb": memory_gb,
        "container_disk_gb": container_disk_gb,
        "volume_gb": volume_gb,
        "volume_mount_path": volume_mount_path,
        "docker_args": docker_args,
        "docker_entrypoint": _entrypoint(entrypoint),
        "min_cuda_version": min_cuda_version,
        "cloud_type": cloud_type.upper() if cloud_type else None,
        "project_id": project_id,
        "bid_per_gpu": bid,
        "interruptible": True if bid is not None else None,
        "snapshot_id": snapshot_id,
        "network_volume_id": network_volume_id,
        "registry_auth_id": registry_auth_id,
    }
    body.update({k: v for k, v in optional.items() if v is not None})
    if env:
        body["env"] = parse_env(env)
    if ports:
        body["ports"] = [parse_port(p) for p in ports]
    call = make_call(url, api_key, as_json)
    with call.client as client:
        c = client.create_cluster(body)
        if wait:
            finish_wait(client, c["id"], timeout, call.as_json)
        else:
            emit(c, call.as_json)


@clusters.command("list")
@click.option("--status", default=None, help="Only clusters in this status.")
@click.option("--search", default=None, help="Match id, name or image.")
@click.option(
    "--project-id",
    type=int,
    default=None,
    help="Project id (default: your account's default project).",
)
@click.option("--all", "every", is_flag=True, help="Every page, not only the newest 500.")
@api_options
def list_(
    status: str | None,
    search: str | None,
    project_id: int | None,
    every: bool,
    url: str | None,
    api_key: str | None,
    as_json: bool,
) -> None:
    """List clusters (newest page of up to 500; --all follows the pages' cursors)."""
    call = make_call(url, api_key, as_json)
    with call.client as client:
        data = client.list_clusters(
            status=status, search=search, project_id=project_id, per_page=500
        )
        while every and (data.get("pagination") or {}).get("next_cursor"):
            more = client.list_clusters(
                status=status,
                search=search,
                project_id=project_id,
                per_page=500,
                cursor=data["pagination"]["next_cursor"],
            )
            data = {**more, "clusters": data["clusters"] + more.get("clusters", [])}
    if call.as_json:
        print_json(data)
        return
    rows = [
        [
            c["id"],
            c.get("name"),
            c.get("status"),
            f"{c.get('gpu_count') or 0}x {c.get('gpu_type')}" if c.get("gpu_count") else "-",
            c.get("cpu_cores"),
            f"{c.get('memory_gb')}G",
            c.get("docker_image"),
            (c.get("cost") or {}).get("hourly_rate"),
            c.get("created_at"),
        ]
        for c in data.get("clusters", [])
    ]
    print_table(
        ["ID", "NAME", "STATUS", "GPUS", "CPU", "MEM", "IMAGE", "$/H", "CREATED"],
        rows,
        "no clusters",
    )
    total = (data.get("pagination") or {}).get("total", len(rows))
    if total > len(rows):
        click.echo(f"({len(rows)} of {total} shown)")


@clusters.command("get")
@click.argument("cluster_id")
@api_options
def get(cluster_id: str, url: str | None, api_key: str | None, as_json: bool) -> None:
    """Show one cluster."""
    call = make_call(url, api_key, as_json)
    with call.client as client:
        emit(client.get_cluster(cluster_id), call.as_json)


@clusters.command("open")
@click.argument("cluster_id")
@click.option(
    "--port",
    "port",
    type=click.IntRange(1, 65535),
    default=None,
    help="The http port (default: the cluster's first).",
)
@api_options
def open_(
    cluster_id: str, port: int | None, url: str | None, api_key: str | None, as_json: bool
) -> None:
    """Print a one-time link that opens a private http port in a browser (it sets a
    cookie for that port's proxy address and works once, for a few minutes)."""
    call = make_call(url, api_key, as_json)
    with call.client as client:
        if port is None:
            ports = (client.get_cluster(cluster_id).get("network") or {}).get("ports") or []
            http = [p["internal_port"] for p in ports if p.get("protocol") == "http"]
            if not http:
                raise click.ClickException(f"cluster {cluster_id} declares no http port")
            port = int(http[0])
        link = client.open_port(cluster_id, port)
    if call.as_json:
        print_json(link)
    else:
        click.echo(f"works once, until {link.get('expires_at')}:")
        click.echo(link["url"])


@clusters.command("start")
@click.argument("cluster_id")
@click.option("--image", default=None, help="New container image.")
@click.option("--memory-gb", type=click.IntRange(min=1), default=None, help="Memory in GB.")
@click.option("--cpu-cores", type=click.IntRange(min=1), default=None, help="vCPUs.")
@click.option(
    "--gpu-count", type=click.IntRange(0, 64), default=None, help="GPUs (0 for a CPU-only cluster)."
)
@click.option("--storage-gb", type=click.IntRange(min=0), default=None, help="Volume size.")
@env_option
@click.option("--unset-env", multiple=True, metavar="KEY", help="Remove a variable (repeatable).")
@port_option
@click.option("--restore", "restore", default=None, metavar="SNAPSHOT",
              help="Replace the volume's data with this snapshot's first.")  # fmt: skip
@click.option("--snapshot-first", is_flag=True,
              help="Snapshot the volume before applying the changes.")  # fmt: skip
@wait_option
@timeout_option
@api_options
def start(
    cluster_id: str,
    image: str | None,
    memory_gb: int | None,
    cpu_cores: int | None,
    gpu_count: int | None,
    storage_gb: int | None,
    env: tuple[str, ...],
    unset_env: tuple[str, ...],
    ports: tuple[str, ...],
    restore: str | None,
    snapshot_first: bool,
    wait: bool,
    timeout: float,
    url: str | None,
    api_key: str | None,
    as_json: bool,
) -> None:
    """Start a stopped cluster, optionally changing its configuration or restoring a
    snapshot first.

    --port replaces the whole port list."""
    body: JSON = {}
    if restore:
        body["restore_from_snapshot"] = restore
    if snapshot_first:
        body["snapshot_before_changes"] = True
    update = {
        k: v
        for k, v in {
            "docker_image": image,
            "memory_gb": memory_gb,
            "cpu_cores": cpu_cores,
            "gpu_count": gpu_count,
            "storage_gb": storage_gb,
        }.items()
        if v is not None
    }
    if update:
        body["update_configuration"] = update
    env_updates: dict[str, str | None] = {**parse_env(env), **dict.fromkeys(unset_env)}
    if env_updates:
        body["environment_updates"] = env_updates
    if ports:
        body["port_mapping_updates"] = [parse_port(p) for p in ports]
    call = make_call(url, api_key, as_json)
    with call.client as client:
        c = client.start_cluster(cluster_id, body)
        applied = c.get("configuration_updates_applied") or []
        if applied and not call.as_json:
            click.echo("applied: " + "; ".join(str(a) for a in applied), err=True)
        before = c.get("snapshot_before_changes")
        if before and not call.as_json:
            click.echo(f"snapshot before changes: {before.get('id')}", err=True)
        if wait:
            finish_wait(client, cluster_id, timeout, call.as_json)
        else:
            emit(c, call.as_json)


@clusters.command("bid-resume")
@click.argument("cluster_id")
@click.option("--bid", type=click.FloatRange(min=0, min_open=True), required=True,
              help="Bid per GPU-hour (USD), at least the GPU type's spot floor.")  # fmt: skip
@click.option(
    "--gpu-count", type=click.IntRange(1, 64), default=None, help="GPUs (default: as before)."
)
@wait_option
@timeout_option
@api_options
def bid_resume(
    cluster_id: str,
    bid: float,
    gpu_count: int | None,
    wait: bool,
    timeout: float,
    url: str | None,
    api_key: str | None,
    as_json: bool,
) -> None:
    """Resume a stopped cluster as spot at --bid (may preempt lower bids)."""
    body: JSON = {"bid_per_gpu": bid}
    if gpu_count is not None:
        body["gpu_count"] = gpu_count
    call = make_call(url, api_key, as_json)
    with call.client as client:
        c = client.bid_resume_cluster(cluster_id, body)
        if wait:
            finish_wait(client, cluster_id, timeout, call.as_json)
        else:
            emit(c, call.as_json)


def _simple(action: str, help_text: str) -> None:
    @clusters.command(action, help=help_text)
    @click.argument("cluster_id")
    @api_options
    def command(cluster_id: str, url: str | None, api_key: str | None, as_json: bool) -> None:
        call = make_call(url, api_key, as_json)
        with call.client as client:
            method = getattr(client, f"{action}_cluster")
            c: JSON = method(cluster_id)
        if call.as_json:
            print_json(c)
        else:
            click.echo(f"{c['id']}: {c.get('status')} ({c.get('last_status_change') or action})")


@clusters.command("stop")
@click.argument("cluster_id")
@click.option("--wait", is_flag=True,
              help="Poll until stopped; exit 1 if it fails or times out.")  # fmt: skip
@timeout_option
@api_options
def stop(
    cluster_id: str, wait: bool, timeout: float, url: str | None, api_key: str | None,
    as_json: bool,
) -> None:  # fmt: skip
    """Stop a cluster: GPUs are released, the volume is kept (a start requested while it
    stops is called off)."""
    call = make_call(url, api_key, as_json)
    with call.client as client:
        c = client.stop_cluster(cluster_id)
        if wait:
            finish_wait(client, cluster_id, timeout, call.as_json, target="stopped")
            return
    if call.as_json:
        print_json(c)
    else:
        click.echo(f"{c['id']}: {c.get('status')} ({c.get('last_status_change') or 'stop'})")


_simple("restart", "Recreate a running cluster's container (container disk wiped).")
_simple("terminate", "Terminate a cluster and delete its volume.")


@clusters.command("events")
@click.argument("cluster_id")
@api_options
def events(cluster_id: str, url: str | None, api_key: str | None, as_json: bool) -> None:
    """A cluster's status changes and other events, oldest first."""
    call = make_call(url, api_key, as_json)
    with call.client as client:
        data = client.cluster_events(cluster_id)
    if call.as_json:
        print_json(data)
        return
    print_events(data.get("events", []))


clusters.add_command(logs)
