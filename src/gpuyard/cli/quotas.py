"""``gpuyard quotas``: an account's and its projects' limits and usage.

- ``gpuyard quotas show ACCOUNT_ID``
- ``gpuyard quotas set ACCOUNT_ID [--project P] [--gpus N] [--gpu-type TYPE=N ...]
  [--vcpus N] [--volume-gb N] [--snapshot-gb N] [--running-clusters N]``: ``none``
  removes a limit; a limit not named is kept. The account's limits are the
  operator's; a project's, the operator's or the account's owners' and admins'.
"""

from __future__ import annotations

from typing import Any

import click

from gpuyard.cli.client import GpuyardClient
from gpuyard.cli.common import api_options, make_call
from gpuyard.cli.output import print_json, print_table

_NONE = ("none", "null", "unlimited", "-")


def _call(client: GpuyardClient, method: str, path: str, body: Any = None) -> dict[str, Any]:
    # Errors come back as ApiError, which the CLI's boundary shows.
    return client.request(method, path, json=body)


def parse_limit(value: str, hint: str) -> int | None:
    """A limit as typed: a whole number of 0 or more, or ``none`` (no limit)."""
    text = value.strip().lower()
    if text in _NONE:
        return None
    if not text.isdigit():
        raise click.BadParameter(f"{value!r} is not a whole number or 'none'", param_hint=hint)
    return int(text)


def parse_gpu_type(value: str) -> tuple[str, int | None]:
    """``TYPE=N`` (or ``TYPE=none``) of ``--gpu-type``."""
    name, sep, limit = value.rpartition("=")
    if not sep or not name.strip():
        raise click.BadParameter(f"{value!r} is not TYPE=N", param_hint="--gpu-type")
    return name.strip(), parse_limit(limit, "--gpu-type")


def _shown(value: int | None) -> str:
    return "-" if value is None else str(value)


def _rows(label: str, scope: dict[str, Any]) -> list[list[str]]:
    """One row per limited or used resource of a scope: LIMIT, IN USE."""
    limits, usage = scope["limits"], scope["usage"]
    rows = [
        [label, name, _shown(limits[name]), str(usage[name])]
        for name in ("gpus", "vcpus", "volume_gb", "snapshot_gb", "running_clusters")
    ]
    types = sorted(set(limits["gpus_by_type"]) | set(usage["gpus_by_type"]))
    rows += [
        [
            label,
            f"gpus[{t}]",
            _shown(limits["gpus_by_type"].get(t)),
            str(usage["gpus_by_type"].get(t, 0)),
        ]
        for t in types
    ]
    return rows


@click.group("quotas")
def quotas() -> None:
    """Limits of an account and its projects: GPUs, vCPUs, storage, clusters."""


@quotas.command("show")
@click.argument("account_id", type=click.IntRange(min=1))
@api_options
def quotas_show(account_id: int, url: str | None, api_key: str | None, as_json: bool) -> None:
    """ACCOUNT_ID's limits and usage, and each project's ('-': no limit)."""
    call = make_call(url, api_key, as_json)
    with call.client as client:
        data = _call(client, "GET", f"/v1/accounts/{account_id}/quotas")
    if call.as_json:
        print_json(data)
        return
    rows = _rows(f"account {account_id}", data["account"])
    for project in data["projects"]:
        rows += _rows(f"project {project['project_id']} ({project['name']})", project)
    print_table(["SCOPE", "RESOURCE", "LIMIT", "IN USE"], rows, "no quotas")


@quotas.command("set")
@click.argument("account_id", type=click.IntRange(min=1))
@click.option("--project", "project_id", type=click.IntRange(min=1), default=None,
              help="A project's limits (default: the account's).")  # fmt: skip
@click.option("--gpus", default=None, help="GPUs of every type together (N or none).")
@click.option("--gpu-type", "gpu_types", multiple=True, metavar="TYPE=N",
              help="GPUs of one type (N or none); repeatable.")  # fmt: skip
@click.option("--vcpus", default=None, help="vCPUs (N or none).")
@click.option("--volume-gb", default=None, help="Volumes and network volumes, GB.")
@click.option("--snapshot-gb", default=None, help="Snapshots' stored data, GB.")
@click.option("--running-clusters", default=None, help="Clusters holding capacity.")
@api_options
def quotas_set(
    account_id: int,
    project_id: int | None,
    gpus: str | None,
    gpu_types: tuple[str, ...],
    vcpus: str | None,
    volume_gb: str | None,
    snapshot_gb: str | None,
    running_clusters: str | None,
    url: str | None,
    api_key: str | None,
    as_json: bool,
) -> None:
    """Set ACCOUNT_ID's limits (or --project's). 'none' removes a limit; limits not
    named are kept."""
    body: dict[str, Any] = {}
    for name, value in (
        ("gpus", gpus),
        ("vcpus", vcpus),
        ("volume_gb", volume_gb),
        ("snapshot_gb", snapshot_gb),
        ("running_clusters", running_clusters),
    ):
        if value is not None:
            body[name] = parse_limit(value, "--" + name.replace("_", "-"))
    if gpu_types:
        body["gpus_by_type"] = dict(parse_gpu_type(v) for v in gpu_types)
    if not body:
        raise click.UsageError("name at least one limit to set (see --help)")
    path = f"/v1/accounts/{account_id}"
    if project_id is not None:
        path += f"/projects/{project_id}"
    call = make_call(url, api_key, as_json)
    with call.client as client:
        data = _call(client, "PUT", path + "/quotas", body)
    if call.as_json:
        print_json(data)
        return
    label = f"project {project_id}" if project_id is not None else f"account {account_id}"
    print_table(["SCOPE", "RESOURCE", "LIMIT", "IN USE"], _rows(label, data), "no quotas")
