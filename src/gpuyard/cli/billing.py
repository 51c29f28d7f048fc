"""``gpuyard billing``: what was spent, by what, in which period."""

from __future__ import annotations

import click

from gpuyard.cli.common import api_options, make_call
from gpuyard.cli.output import print_json, print_table


@click.command("billing")
@click.option("--from", "from_", default=None, help="ISO date/time (default: month start).")
@click.option("--to", default=None, help="ISO date/time (default: now).")
@click.option(
    "--group-by",
    type=click.Choice(["cluster", "gpu_type", "day"]),
    default="cluster",
    show_default=True,
    help="How to total the cost.",
)
@click.option("--project-id", type=int, default=None, help="One project (default: all).")
@api_options
def billing(
    from_: str | None,
    to: str | None,
    group_by: str,
    project_id: int | None,
    url: str | None,
    api_key: str | None,
    as_json: bool,
) -> None:
    """Spend of your account in a period (metered per second), grouped."""
    call = make_call(url, api_key, as_json)
    with call.client as client:
        data = client.billing(from_=from_, to=to, group_by=group_by, project_id=project_id)
    if call.as_json:
        print_json(data)
        return
    rows = [
        [
            item["key"] + (f" ({item['name']})" if item.get("name") else ""),
            f"{item['gpu_hours']:.4f}",
            f"{item['breakdown']['gpu']:.6f}",
            f"{item['total_usd']:.6f}",
        ]
        for item in data.get("items", [])
    ]
    click.echo(f"{data['from']} .. {data['to']}  by {data['group_by']}")
    print_table([group_by.upper(), "GPU-H", "GPU $", "TOTAL $"], rows, "no usage")
    click.echo(f"total: {data['total_usd']:.6f} {data['currency']}")
