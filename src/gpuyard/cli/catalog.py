"""``gpuyard gpu-types`` (hosts: cli/hosts.py)."""

from __future__ import annotations

import click

from gpuyard.cli.common import api_options, make_call
from gpuyard.cli.output import print_json, print_table


@click.command("gpu-types")
@api_options
def gpu_types(url: str | None, api_key: str | None, as_json: bool) -> None:
    """The GPU catalog: memory, prices per GPU-hour and how many are free."""
    call = make_call(url, api_key, as_json)
    with call.client as client:
        data = client.gpu_types()
    if call.as_json:
        print_json(data)
        return
    rows = [
        [
            g["id"],
            f"{g.get('memory_gb')}G",
            g.get("secure_price"),
            g.get("community_price"),
            g.get("secure_spot_price"),
            f"{g.get('available_gpus', 0)}/{g.get('total_gpus', 0)}",
        ]
        for g in data.get("gpu_types", [])
    ]
    print_table(
        ["ID", "MEM", "SECURE $/H", "COMMUNITY $/H", "SPOT $/H", "FREE/TOTAL"], rows, "no GPU types"
    )
