"""``gpuyard gpu-types`` and ``gpuyard hosts``."""

from __future__ import annotations

from typing import Any

import click

from gpuyard.cli.common import api_options, make_call
from gpuyard.cli.output import cell, print_json, print_table


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


@click.command("hosts")
@api_options
def hosts(url: str | None, api_key: str | None, as_json: bool) -> None:
    """Hosts with capacity and what is free (needs an admin key)."""
    call = make_call(url, api_key, as_json)
    with call.client as client:
        data = client.hosts()
    if call.as_json:
        print_json(data)
        return
    click.echo(f"installation: {data.get('installation_id') or 'unknown'}")
    rows = []
    for h in data.get("hosts", []):
        free = h.get("free") or {}
        gpus = h.get("gpus") or []
        types = sorted({str(g.get("type")) for g in gpus})
        free_gpus = sum(1 for g in gpus if not g.get("allocated"))
        rows.append(
            [
                h["id"],
                h.get("name"),
                h.get("location"),
                h.get("cloud_type"),
                f"{free_gpus}/{len(gpus)} {', '.join(types)} ({h.get('gpu_source')})"
                if gpus
                else f"none ({h.get('gpu_source')})",
                f"{cell(free.get('vcpus'))}/{h.get('vcpus')}",
                f"{cell(free.get('memory_gb'))}/{h.get('memory_gb')}G",
                f"{cell(free.get('disk_gb'))}/{h.get('disk_gb')}G",
                h.get("healthy"),
                limits_cell(h),
                h.get("engine_url") or "none",
            ]
        )
    print_table(
        ["ID", "NAME", "LOCATION", "CLOUD", "GPUS FREE", "VCPU FREE", "MEM FREE", "DISK FREE",
         "HEALTHY", "LIMITS", "ENGINE"],
        rows,
        "no hosts",
    )  # fmt: skip


def limits_cell(host: dict[str, Any]) -> str:
    """``enforced``, or ``NOT ENFORCED`` with the host's note: an operator must see at a
    glance that tenants on this host are not held to their CPU and memory."""
    if host.get("enforces_limits", True):
        return "enforced"
    note = host.get("limits_note")
    return f"NOT ENFORCED ({note})" if note else "NOT ENFORCED"
