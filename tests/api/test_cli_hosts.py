"""``gpuyard hosts``: the installation id above the table, and a limits column that
says plainly when a host does not enforce CPU/memory limits."""

from __future__ import annotations

import json

from click.testing import CliRunner, Result
from sqlalchemy import select

from gpuyard.cli.main import cli
from gpuyard.store.schema import Host
from tests.helpers import LiveServer


def run(srv: LiveServer, *args: str) -> Result:
    env = {
        "GPUYARD_URL": srv.url,
        "GPUYARD_API_KEY": srv.key,
        "GPUYARD_HOME": str(srv.server.ctx.settings.home),
    }
    return CliRunner().invoke(cli, list(args), env=env)


def test_hosts_prints_the_installation_id_and_the_limits(srv: LiveServer) -> None:
    installation = srv.server.ctx.ownership.installation_id
    result = run(srv, "hosts")
    assert result.exit_code == 0, result.output
    first, header, row = result.stdout.splitlines()
    assert first == f"installation: {installation}"
    assert "LIMITS" in header.split()
    assert "enforced" in row.split() and "NOT ENFORCED" not in row

    with srv.server.ctx.transaction() as s:
        host = s.scalars(select(Host)).one()
        host.enforces_limits, host.limits_note = False, "no cpu controller"
    result = run(srv, "hosts")
    assert result.exit_code == 0, result.output
    assert "NOT ENFORCED (no cpu controller)" in result.stdout.splitlines()[2]


def test_hosts_json_carries_the_installation_id(srv: LiveServer) -> None:
    result = run(srv, "hosts", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["installation_id"] == srv.server.ctx.ownership.installation_id
    assert data["hosts"][0]["enforces_limits"] is True
