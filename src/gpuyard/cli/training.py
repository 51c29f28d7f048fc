"""``gpuyard training``: Slurm training clusters (seed 002's API)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click
import httpx

from gpuyard.cli.client import ApiError, GpuyardClient, ServerUnreachable
from gpuyard.cli.common import api_options, make_call
from gpuyard.cli.output import print_events, print_json, print_table

BASE = "/distributed_jobs_v2/cluster/"
ACTIONS = (
    "update_ssh_keys",
    "update_image",
    "restart_workers",
    "restart_cluster",
    "scale_cluster",
    "attach_ip",
    "detach_ip",
    "add_security_group",
    "remove_security_group",
    "update_auto_terminate",
)
RESTING = ("running", "error")


def auto_terminate_options(f: Any) -> Any:
    """The auto-termination policy's options (on create, and for update_auto_terminate)."""
    f = click.option(
        "--auto-terminate-off",
        is_flag=True,
        help="update_auto_terminate: disable the policy (its rules are kept).",
    )(f)
    f = click.option(
        "--auto-action",
        type=click.Choice(["stop", "delete"]),
        default=None,
        help="What auto-termination does (default stop: the Slurm state is kept).",
    )(f)
    f = click.option(
        "--max-runtime-hours", type=float, default=None, help="Stop after N hours of the run."
    )(f)
    f = click.option(
        "--cost-limit-usd", type=float, default=None, help="Stop once the run billed N USD."
    )(f)
    f = click.option(
        "--idle-minutes",
        type=float,
        default=None,
        help="Stop after N minutes with no running or pending Slurm job.",
    )(f)
    return f


def _policy(
    idle_minutes: float | None,
    cost_limit_usd: float | None,
    max_runtime_hours: float | None,
    auto_action: str | None,
    off: bool,
) -> dict[str, Any] | None:
    """The ``auto_terminate`` object the options give (None: no option given)."""
    given = {
        "idle_minutes": idle_minutes,
        "cost_limit_usd": cost_limit_usd,
        "max_runtime_hours": max_runtime_hours,
        "action": auto_action,
    }
    policy: dict[str, Any] = {k: v for k, v in given.items() if v is not None}
    if off:
        policy["enabled"] = False
    return policy or None


def call(
    client: GpuyardClient,
    method: str,
    path: str,
    params: dict[str, str | int],
    body: dict[str, Any] | None = None,
) -> Any:
    """One request in the training envelope ``{code, data, errors, message}``; raises
    ApiError with the error's code, message and details."""
    try:
        resp = client.http.request(method, path, params=params, json=body)
    except httpx.TransportError as e:
        raise ServerUnreachable(client.url, str(e) or type(e).__name__) from e
    try:
        payload = resp.json()
    except ValueError:
        payload = None
    if not isinstance(payload, dict):
        raise ApiError("HTTP_ERROR", f"HTTP {resp.status_code}", None, resp.status_code)
    if resp.is_success:
        return payload.get("data")
    raw_errors = payload.get("errors")
    errors: dict[str, Any] = raw_errors if isinstance(raw_errors, dict) else {}
    raw_details = errors.get("details")
    details = raw_details if isinstance(raw_details, dict) else None
    raise ApiError(
        str(errors.get("code") or "HTTP_ERROR"),
        str(payload.get("message") or resp.reason_phrase),
        details,
        resp.status_code,
    )


def scope_options(f: Any) -> Any:
    f = click.option("--active-iam", type=int, default=None, help="Act for this membership.")(f)
    f = click.option("--location", default="local", show_default=True, help="Location.")(f)
    f = click.option("--project-id", type=int, required=True, help="Project id.")(f)
    return f


def _params(project_id: int, location: str, active_iam: int | None) -> dict[str, str | int]:
    params: dict[str, str | int] = {"project_id": project_id, "location": location}
    if active_iam is not None:
        params["active_iam"] = active_iam
    return params


def _show(cluster: dict[str, Any]) -> None:
    click.echo(f"{cluster['id']}  {cluster['name']}  {cluster['status']}")
    if cluster.get("error_message"):
        click.echo(f"  error: {cluster['error_message']}")
    if cluster.get("ssh"):
        click.echo(f"  ssh: {cluster['ssh']['command']}")
    for ip in cluster.get("reserved_ips", []):
        click.echo(f"  reserved IP: {ip['address']} (id {ip['id']})")
    rows = [
        [
            n["name"],
            n["role"],
            n["status"],
            n.get("host"),
            ",".join(map(str, n["gpu_indices"])),
            _lifecycle(n.get("lifecycle")),
        ]
        for n in cluster.get("nodes", [])
    ]
    print_table(["NODE", "ROLE", "STATUS", "HOST", "GPUS", "LIFECYCLE"], rows, "no nodes")
    slurm = cluster.get("slurm") or {}
    if slurm.get("nodes"):
        click.echo("  slurm: " + ", ".join(f"{n['name']}={n['state']}" for n in slurm["nodes"]))
    click.echo("  " + auto_terminate_line(cluster.get("auto_terminate")))


def auto_terminate_line(policy: dict[str, Any] | None) -> str:
    """The policy and what fires next, in one line."""
    if not policy or not policy.get("enabled"):
        return "auto-terminate: off"
    rules = []
    if policy.get("idle_minutes") is not None:
        rules.append(f"idle {policy['idle_minutes']:g} min")
    if policy.get("cost_limit_usd") is not None:
        rules.append(f"cost {policy['cost_limit_usd']:.2f} USD")
    if policy.get("max_runtime_hours") is not None:
        rules.append(f"runtime {policy['max_runtime_hours']:g} h")
    line = f"auto-terminate: {', '.join(rules) or 'no rule'} -> {policy.get('action', 'stop')}"
    if policy.get("error"):
        return f"{line} (not enforced: {policy['error']})"
    left = policy.get("seconds_left")
    if isinstance(left, int | float):
        line += f"; {policy.get('next_rule')} in {_duration(left)} ({policy['next_deadline_at']})"
    return line


def _duration(seconds: float) -> str:
    whole = int(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


def _lifecycle(result: dict[str, Any] | None) -> str:
    if not result:
        return "-"
    code = result.get("exit_code")
    return f"{result['status']} (exit {code})" if code else str(result["status"])


def _wait(
    client: GpuyardClient, cluster_id: int, params: dict[str, str | int], timeout: float
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        data: dict[str, Any] = call(client, "GET", f"{BASE}{cluster_id}/", params)
        if data["status"] in RESTING or time.monotonic() > deadline:
            return data
        time.sleep(1.0)


@click.group("training")
def training() -> None:
    """Slurm training clusters: a controller (login) node and GPU worker nodes."""


@training.command("create")
@scope_options
@click.option("--name", required=True, help="Cluster name.")
@click.option("--image-version-id", type=int, required=True, help="See `gpuyard images list`.")
@click.option(
    "--ssh-key-id",
    "ssh_key_ids",
    type=int,
    multiple=True,
    required=True,
    help="SSH key id for the nodes (repeatable; see `gpuyard ssh-keys list`).",
)
@click.option("--nodes", "no_of_nodes", type=int, required=True, help="Worker nodes.")
@click.option("--sku-id", type=int, default=None, help="A plan (`gpuyard plans`).")
@click.option(
    "--gpu-type", default=None, help="GPU type id (e.g. 'NVIDIA RTX A6000'; default: the plan's)."
)
@click.option("--gpus-per-node", type=int, default=None, help="GPUs per worker node.")
@click.option("--cpus-per-node", type=int, default=None, help="vCPUs per worker node.")
@click.option("--memory-gb-per-node", type=int, default=None, help="Memory per worker node in GB.")
@click.option("--security-group-id", type=int, default=None, help="Security group for the nodes.")
@click.option(
    "--lifecycle-script",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="Script run on each node at start.",
)
@auto_terminate_options
@click.option("--wait", "wait_s", type=float, default=0, help="Wait up to N s until running.")
@api_options
def create(
    project_id: int,
    location: str,
    active_iam: int | None,
    name: str,
    image_version_id: int,
    ssh_key_ids: tuple[int, ...],
    no_of_nodes: int,
    sku_id: int | None,
    gpu_type: str | None,
    gpus_per_node: int | None,
    cpus_per_node: int | None,
    memory_gb_per_node: int | None,
    security_group_id: int | None,
    lifecycle_script: str | None,
    idle_minutes: float | None,
    cost_limit_usd: float | None,
    max_runtime_hours: float | None,
    auto_action: str | None,
    auto_terminate_off: bool,
    wait_s: float,
    url: str | None,
    api_key: str | None,
    as_json: bool,
) -> None:
    """Create a training cluster (with an auto-termination policy when one of its
    options is given)."""
    body: dict[str, Any] = {
        "name": name,
        "image_version_id": image_version_id,
        "ssh_key_ids": list(ssh_key_ids),
        "no_of_nodes": no_of_nodes,
    }
    optional = {
        "sku_id": sku_id,
        "gpu_type": gpu_type,
        "gpus_per_node": gpus_per_node,
        "cpus_per_node": cpus_per_node,
        "memory_gb_per_node": memory_gb_per_node,
        "security_group_id": security_group_id,
    }
    body.update({k: v for k, v in optional.items() if v is not None})
    if lifecycle_script:
        body["lifecycle_script"] = Path(lifecycle_script).read_text()
    policy = _policy(
        idle_minutes, cost_limit_usd, max_runtime_hours, auto_action, auto_terminate_off
    )
    if policy is not None:
        body["auto_terminate"] = policy
    c = make_call(url, api_key, as_json)
    params = _params(project_id, location, active_iam)
    with c.client as client:
        data = call(client, "POST", BASE, params, body)
        if wait_s > 0:
            data = _wait(client, data["id"], params, wait_s)
    print_json(data) if c.as_json else _show(data)


@training.command("list")
@scope_options
@api_options
def list_(
    project_id: int,
    location: str,
    active_iam: int | None,
    url: str | None,
    api_key: str | None,
    as_json: bool,
) -> None:
    """Training clusters of a project at a location."""
    c = make_call(url, api_key, as_json)
    with c.client as client:
        data = call(client, "GET", BASE, _params(project_id, location, active_iam))
    if c.as_json:
        print_json(data)
        return
    rows = [
        [d["id"], d["name"], d["status"], d["no_of_nodes"], d["plan"]["gpu_type"]] for d in data
    ]
    print_table(["ID", "NAME", "STATUS", "WORKERS", "GPU"], rows, "no training clusters")


@training.command("get")
@scope_options
@click.argument("cluster_id", type=int)
@api_options
def get(
    project_id: int,
    location: str,
    active_iam: int | None,
    cluster_id: int,
    url: str | None,
    api_key: str | None,
    as_json: bool,
) -> None:
    """One training cluster: nodes, SSH entry, Slurm state."""
    c = make_call(url, api_key, as_json)
    with c.client as client:
        data = call(
            client, "GET", f"{BASE}{cluster_id}/", _params(project_id, location, active_iam)
        )
    print_json(data) if c.as_json else _show(data)


@training.command("action")
@scope_options
@click.argument("cluster_id", type=int)
@click.argument("action", type=click.Choice(ACTIONS))
@click.option(
    "--ssh-key-id", "ssh_key_ids", type=int, multiple=True, help="SSH key id to add (repeatable)."
)
@click.option(
    "--image-version-id",
    type=int,
    default=None,
    help="Image version to move to (`gpuyard images list`).",
)
@click.option("--additional-nodes", type=int, default=None, help="Worker nodes to add.")
@click.option("--reserved-ip-id", type=int, default=None, help="Reserved IP to attach.")
@click.option("--ip-type", default=None, help="detach_ip: public or reserved.")
@click.option(
    "--security-group-id",
    "security_group_ids",
    type=int,
    multiple=True,
    help="Security group to apply (repeatable).",
)
@auto_terminate_options
@click.option("--wait", "wait_s", type=float, default=0, help="Wait up to N s until done.")
@api_options
def action(
    project_id: int,
    location: str,
    active_iam: int | None,
    cluster_id: int,
    action: str,
    ssh_key_ids: tuple[int, ...],
    image_version_id: int | None,
    additional_nodes: int | None,
    reserved_ip_id: int | None,
    ip_type: str | None,
    security_group_ids: tuple[int, ...],
    idle_minutes: float | None,
    cost_limit_usd: float | None,
    max_runtime_hours: float | None,
    auto_action: str | None,
    auto_terminate_off: bool,
    wait_s: float,
    url: str | None,
    api_key: str | None,
    as_json: bool,
) -> None:
    """Run one of the nine actions, or update_auto_terminate (the options given change
    the policy, the others stay). The server names any missing field."""
    body: dict[str, Any] = {"action": action}
    if ssh_key_ids:
        body["ssh_key_ids"] = list(ssh_key_ids)
    if image_version_id is not None:
        body["image_version_id"] = image_version_id
    if additional_nodes is not None:
        body["additional_nodes"] = additional_nodes
    if reserved_ip_id is not None:
        body["reserved_ip_id"] = reserved_ip_id
    if ip_type is not None:
        body["ip_type"] = ip_type
    if security_group_ids:
        if action == "remove_security_group":
            body["security_group_id"] = security_group_ids[0]
        else:
            body["security_groups_ids"] = list(security_group_ids)
    policy = _policy(
        idle_minutes, cost_limit_usd, max_runtime_hours, auto_action, auto_terminate_off
    )
    if policy is not None:
        body["auto_terminate"] = policy
    c = make_call(url, api_key, as_json)
    params = _params(project_id, location, active_iam)
    with c.client as client:
        data = call(client, "PUT", f"{BASE}{cluster_id}/", params, body)
        if wait_s > 0 and isinstance(data, dict) and "nodes" in data:
            data = _wait(client, cluster_id, params, wait_s)
    if c.as_json or not (isinstance(data, dict) and "nodes" in data):
        print_json(data)
    else:
        _show(data)


@training.command("delete")
@scope_options
@click.argument("cluster_id", type=int)
@api_options
def delete(
    project_id: int,
    location: str,
    active_iam: int | None,
    cluster_id: int,
    url: str | None,
    api_key: str | None,
    as_json: bool,
) -> None:
    """Delete a training cluster and everything it holds."""
    c = make_call(url, api_key, as_json)
    with c.client as client:
        data = call(
            client, "DELETE", f"{BASE}{cluster_id}/", _params(project_id, location, active_iam)
        )
    print_json(data) if c.as_json else click.echo(f"{cluster_id} deleting")


@training.command("events")
@scope_options
@click.argument("cluster_id", type=int)
@api_options
def events(
    project_id: int,
    location: str,
    active_iam: int | None,
    cluster_id: int,
    url: str | None,
    api_key: str | None,
    as_json: bool,
) -> None:
    """A training cluster's status changes and why, oldest first."""
    c = make_call(url, api_key, as_json)
    with c.client as client:
        data = call(
            client,
            "GET",
            f"{BASE}{cluster_id}/events/",
            _params(project_id, location, active_iam),
        )
    print_json(data) if c.as_json else print_events(data)
