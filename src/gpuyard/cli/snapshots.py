"""``gpuyard snapshots``: take, list, read and delete snapshots of cluster volumes."""

from __future__ import annotations

import time
from typing import Any

import click

from gpuyard.cli.common import api_options, make_call
from gpuyard.cli.output import Progress, fail, human_bytes, key_values, print_json, print_table

# How often ``create --wait`` asks how far the snapshot is.
POLL_S = 0.5


def _source(s: dict[str, Any]) -> str:
    if s.get("source_network_volume_id") and not s.get("source_cluster_id"):
        return f"volume {s['source_network_volume_id']}"
    return str(s.get("source_cluster_id") or "-")


def _show(s: dict[str, Any]) -> None:
    click.echo(
        key_values(
            [
                ("id", s.get("id")),
                ("name", s.get("name")),
                ("status", f"{s.get('status')}" + (f" ({s['error']})" if s.get("error") else "")),
                ("source", _source(s)),
                ("consistency", s.get("consistency")),
                ("size", human_bytes(s.get("size_bytes"))),
                ("stored", human_bytes(s.get("stored_bytes"))),
                ("files", s.get("file_count")),
                ("created", s.get("created_at")),
                ("ready", s.get("ready_at")),
            ]
        )
    )


@click.group("snapshots", invoke_without_command=True)
@click.option("--cluster", "cluster_id", default=None, help="Only this cluster's snapshots.")
@click.option("--project", "project_id", type=int, default=None, help="Only this project's.")
@api_options
@click.pass_context
def snapshots(
    ctx: click.Context,
    cluster_id: str | None,
    project_id: int | None,
    url: str | None,
    api_key: str | None,
    as_json: bool,
) -> None:
    """Snapshots of cluster volumes and network volumes (list them without a
    subcommand). Restore one with `gpuyard clusters start ID --restore SNAPSHOT`."""
    if ctx.invoked_subcommand is not None:
        return
    call = make_call(url, api_key, as_json)
    with call.client as client:
        data = client.list_snapshots(cluster_id=cluster_id, project_id=project_id)
    if call.as_json:
        print_json(data)
        return
    rows = [
        [
            s["id"],
            s.get("name"),
            _source(s),
            s.get("status"),
            s.get("consistency"),
            human_bytes(s.get("size_bytes")),
            human_bytes(s.get("stored_bytes")),
            s.get("created_at"),
        ]
        for s in data.get("snapshots", [])
    ]
    print_table(
        ["ID", "NAME", "SOURCE", "STATUS", "CONSISTENCY", "SIZE", "STORED", "CREATED"],
        rows,
        "no snapshots",
    )


@snapshots.command("list")
@click.option("--cluster", "cluster_id", default=None, help="Only this cluster's snapshots.")
@click.option("--project", "project_id", type=int, default=None, help="Only this project's.")
@api_options
@click.pass_context
def list_(
    ctx: click.Context,
    cluster_id: str | None,
    project_id: int | None,
    url: str | None,
    api_key: str | None,
    as_json: bool,
) -> None:
    """List snapshots, newest first."""
    ctx.invoke(
        snapshots,
        cluster_id=cluster_id,
        project_id=project_id,
        url=url,
        api_key=api_key,
        as_json=as_json,
    )


@snapshots.command("create")
@click.argument("cluster_id")
@click.option("--name", default="", help="A name (default: snapshot-<time>).")
@click.option("--description", default="", help="What it is for.")
@click.option("--wait/--no-wait", default=True, show_default=True, help="Wait until done.")
@api_options
def create(
    cluster_id: str,
    name: str,
    description: str,
    wait: bool,
    url: str | None,
    api_key: str | None,
    as_json: bool,
) -> None:
    """Snapshot CLUSTER_ID's volume, with a progress bar until it is ready."""
    call = make_call(url, api_key, as_json)
    with call.client as client:
        snap = client.create_snapshot(cluster_id, {"name": name, "description": description})
        if wait:
            progress = Progress()
            # The volume's size is not known before it is read: the bar shows the
            # bytes read against the volume's size in GB, capped below 100 %.
            total = max(1, int(snap.get("volume_gb") or 0) * 1_000_000_000)
            while snap.get("status") == "creating":
                done = int((snap.get("progress") or {}).get("bytes_done") or 0)
                progress.update(
                    "creating", min(99, done * 100 // total), f"{human_bytes(done)} read"
                )
                time.sleep(POLL_S)
                snap = client.get_snapshot(str(snap["id"]))
            progress.update(str(snap.get("status")), 100, "done")
            progress.finish()
    if call.as_json:
        print_json(snap)
    else:
        _show(snap)
    if snap.get("status") == "failed":
        fail(f"snapshot {snap.get('id')} failed: {snap.get('error')}")


@snapshots.command("get")
@click.argument("snapshot_id")
@api_options
def get(snapshot_id: str, url: str | None, api_key: str | None, as_json: bool) -> None:
    """Show one snapshot."""
    call = make_call(url, api_key, as_json)
    with call.client as client:
        snap = client.get_snapshot(snapshot_id)
    if call.as_json:
        print_json(snap)
    else:
        _show(snap)


@snapshots.command("delete")
@click.argument("snapshot_id")
@api_options
def delete(snapshot_id: str, url: str | None, api_key: str | None, as_json: bool) -> None:
    """Delete a snapshot (its data leaves the repository in the background)."""
    call = make_call(url, api_key, as_json)
    with call.client as client:
        data = client.delete_snapshot(snapshot_id)
    if call.as_json:
        print_json(data)
    else:
        click.echo(f"deleted snapshot {snapshot_id}")
