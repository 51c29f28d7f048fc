"""``gpuyard orphans``: volumes of this installation that the database does not know
(quarantined, not deleted), and ``gpuyard orphans delete ID``."""

from __future__ import annotations

import click

from gpuyard.cli.common import api_options, make_call
from gpuyard.cli.output import human_bytes, print_json, print_table


@click.group("orphans", invoke_without_command=True)
@click.option("--all", "include_done", is_flag=True, help="Also deleted and released ones.")
@api_options
@click.pass_context
def orphans(
    ctx: click.Context, include_done: bool, url: str | None, api_key: str | None, as_json: bool
) -> None:
    """Quarantined volumes: ours, unknown to the database, kept until their retention
    passes or an admin deletes them (needs an admin key)."""
    if ctx.invoked_subcommand is not None:
        return
    call = make_call(url, api_key, as_json)
    with call.client as client:
        data = client.orphans(include_done=include_done)
    if call.as_json:
        print_json(data)
        return
    click.echo(f"installation: {data.get('installation_id')}")
    rows = [
        [
            o["id"],
            o.get("name"),
            o.get("host"),
            o.get("cluster_id") or "-",
            human_bytes(o.get("size_bytes"), "?"),
            o.get("found_at"),
            o.get("delete_after") or "kept",
            o.get("status"),
        ]
        for o in data.get("orphans", [])
    ]
    print_table(
        ["ID", "VOLUME", "HOST", "CLUSTER", "SIZE", "FOUND", "DELETE AFTER", "STATUS"],
        rows,
        "no orphans",
    )


@orphans.command("delete")
@click.argument("orphan_id")
@api_options
def delete(orphan_id: str, url: str | None, api_key: str | None, as_json: bool) -> None:
    """Delete a quarantined volume now, with its data."""
    call = make_call(url, api_key, as_json)
    with call.client as client:
        data = client.delete_orphan(orphan_id)
    if call.as_json:
        print_json(data)
        return
    click.echo(f"deleted volume {data.get('name')} (orphan {data.get('id')})")
