"""``gpuyard hosts``: the installation id above the table, a limits column that says
plainly when a host does not enforce CPU/memory limits, and the fleet commands (add
with its wait for the first heartbeat, get, cordon, uncordon, delete, key)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from gpuyard.cli.hosts import POLL_S, wait_reachable
from gpuyard.cli.main import cli
from gpuyard.testing.fake_runtime import FakeRuntime
from tests.helpers import LiveServer, live_server, make_settings


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

    # Said by the engine, as the reconciler's observation stores it.
    runtime = srv.server.reconciler.fleet.local
    assert isinstance(runtime, FakeRuntime)
    runtime.limits_problem = "no cpu controller"
    srv.server.reconciler.observe()
    result = run(srv, "hosts")
    assert result.exit_code == 0, result.output
    assert "NOT ENFORCED (no cpu controller)" in result.stdout.splitlines()[2]


def test_hosts_json_carries_the_installation_id(srv: LiveServer) -> None:
    result = run(srv, "hosts", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["installation_id"] == srv.server.ctx.ownership.installation_id
    assert data["hosts"][0]["enforces_limits"] is True


# -- the fleet commands ------------------------------------------------------------------

H100 = "NVIDIA H100 80GB HBM3"
DECLARED = ("--gpus", "H100 SXM:2", "--vcpus", "16", "--memory-gb", "128", "--disk-gb", "900")


@pytest.fixture
def beating(tmp_path: Path) -> Iterator[LiveServer]:
    """A server that heartbeats its hosts every 0.2 s."""
    settings = make_settings(tmp_path / "home", heartbeat_interval_s=0.2)
    with live_server(settings, FakeRuntime()) as server:
        yield server


def ok_json(result: Result) -> Any:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_add_waits_for_the_first_heartbeat_and_says_what_it_found(beating: LiveServer) -> None:
    result = run(
        beating, "hosts", "add", "gpu-1", "--engine", "ssh://gpuyard@10.1.2.3:2222",
        "--location", "lab", "--cloud-type", "community", *DECLARED,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    first, found = result.stdout.splitlines()
    assert first.startswith("added host 2 (gpu-1), engine ssh://gpuyard@10.1.2.3:2222")
    assert found.startswith("reachable: engine ")
    assert "16 vCPUs (declared)" in found and f"2/2 {H100} (declared)" in found

    table = run(beating, "hosts")
    assert table.exit_code == 0, table.output
    lines = table.stdout.splitlines()
    assert lines[0].startswith("installation: ")
    header = lines[1]
    for column in ("STATUS", "REACHABILITY", "GPUS FREE/TOTAL", "ENGINE", "LAST HEARTBEAT"):
        assert column in header
    [row] = [line for line in lines[2:] if " gpu-1 " in line]
    assert "active" in row.split() and "reachable" in row.split()
    assert "lab" in row.split() and "COMMUNITY" in row.split()
    assert "16/16" in row.split() and "128/128G" in row.split()
    assert "ssh://gpuyard@10.1.2.3:2222" in row and "ago" in row


def test_add_without_an_answer_says_why_and_fails(beating: LiveServer) -> None:
    runtime = beating.server.reconciler.fleet.local
    assert isinstance(runtime, FakeRuntime)
    runtime.unavailable = "ssh: Permission denied (publickey)"
    try:
        result = run(
            beating, "hosts", "add", "locked", "--engine", "ssh://root@10.9.9.9",
            "--wait-timeout", "6",  # a heartbeat on a loaded machine, with room
        )  # fmt: skip
    finally:
        runtime.unavailable = None
    assert result.exit_code == 1, result.output
    assert "added host 2 (locked)" in result.stdout
    assert "not reachable after 6 s: ssh: Permission denied (publickey)" in result.stdout
    assert "gpuyard hosts get 2" in result.stderr


def test_get_cordon_uncordon_delete_and_their_json(srv: LiveServer) -> None:
    host = ok_json(
        run(srv, "hosts", "add", "gpu-2", "--engine", "unix:///run/x/podman.sock",
            "--no-wait", "--json", *DECLARED)
    )  # fmt: skip
    assert host["name"] == "gpu-2" and host["reachability"] in ("unknown", "reachable")
    hid = str(host["id"])

    shown = run(srv, "hosts", "get", hid)
    assert shown.exit_code == 0, shown.output
    assert "name:" in shown.stdout and "gpu-2" in shown.stdout
    assert "clusters: none" in shown.stdout
    assert ok_json(run(srv, "hosts", "get", hid, "--json"))["id"] == host["id"]

    cordoned = run(srv, "hosts", "cordon", hid)
    assert cordoned.exit_code == 0, cordoned.output
    assert cordoned.stdout.strip() == f"host {hid} (gpu-2) cordoned: status cordoned"
    assert ok_json(run(srv, "hosts", "uncordon", hid, "--json"))["status"] == "active"

    local = run(srv, "hosts", "delete", "1")
    assert local.exit_code == 1 and "LOCAL_HOST" in local.stderr
    assert ok_json(run(srv, "hosts", "delete", hid, "--json")) == {
        "id": host["id"],
        "name": "gpu-2",
        "deleted": True,
    }
    gone = run(srv, "hosts", "get", hid)
    assert gone.exit_code == 1 and "HOST_NOT_FOUND" in gone.stderr
    bad = run(srv, "hosts", "get", "abc")
    assert bad.exit_code == 2  # refused by the CLI itself


def test_add_refusals_name_the_field(srv: LiveServer) -> None:
    result = run(srv, "hosts", "add", "x", "--engine", "ssh://gpu-1", "--no-wait")
    assert result.exit_code == 1
    assert "VALIDATION_ERROR" in result.stderr and "engine_url" in result.stderr


def test_key_prints_the_installations_public_key(srv: LiveServer) -> None:
    result = run(srv, "hosts", "key")
    assert result.exit_code == 0, result.output
    line = (srv.server.ctx.settings.home / "ssh" / "id_ed25519.pub").read_text().strip()
    assert line.startswith("ssh-ed25519 ") and result.stdout == line + "\n"
    assert ok_json(run(srv, "hosts", "key", "--json")) == {"public_key": line}


def test_wait_stops_at_its_deadline_and_once_the_inventory_is_in() -> None:
    """``wait_reachable`` with a fake clock: reachable but not yet discovered keeps it
    polling; discovered ends it; the deadline ends it either way."""
    now = [0.0]
    answers = iter(
        [
            {"reachability": "unknown", "inventory": {"vcpus": "discovered"}},
            {"reachability": "reachable", "inventory": {"vcpus": "discovered"}},
            {
                "reachability": "reachable",
                "inventory": {"vcpus": "discovered"},
                "engine_version": "4.9.3",
            },
        ]
    )

    def sleep(s: float) -> None:
        now[0] += s

    host, ok = wait_reachable(lambda: next(answers), 30, sleep=sleep, clock=lambda: now[0])
    assert ok and host["engine_version"] == "4.9.3" and now[0] == 2 * POLL_S
    never = {"reachability": "unknown", "inventory": {}}
    now[0] = 0.0
    host, ok = wait_reachable(lambda: never, 3, sleep=sleep, clock=lambda: now[0])
    assert not ok and now[0] == pytest.approx(3.0)


def test_hosts_set_changes_the_client_address(srv: LiveServer) -> None:
    host_id = str(json.loads(run(srv, "hosts", "--json").stdout)["hosts"][0]["id"])
    result = run(srv, "hosts", "set", host_id, "--client-address", "gpu1.example.org")
    assert result.exit_code == 0, result.output
    assert "clients reach it at gpu1.example.org" in result.stdout
    shown = run(srv, "hosts", "get", host_id)
    assert "client address" in shown.stdout and "gpu1.example.org" in shown.stdout
    bad = run(srv, "hosts", "set", host_id, "--client-address", "not an address")
    assert bad.exit_code != 0 and "client_address" in bad.output
    back = run(srv, "hosts", "set", host_id, "--client-address", "", "--json")
    assert back.exit_code == 0 and json.loads(back.stdout)["client_address"] is None
    assert run(srv, "hosts", "set", host_id).exit_code != 0  # nothing to change
