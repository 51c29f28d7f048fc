"""The CLI's HTTP commands against a real server (FakeRuntime), and ``gpuyard keys``
against the same store."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner, Result

from gpuyard.cli.main import cli
from gpuyard.core.tls_trust import trusted_tls
from gpuyard.testing.fake_runtime import FakeRuntime
from tests.helpers import LiveServer, free_port, live_server, make_settings
from tests.required_parts import needs_tools

A6000 = "NVIDIA RTX A6000"


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


@pytest.fixture
def runtime() -> FakeRuntime:
    return FakeRuntime()


@pytest.fixture
def server(home: Path, runtime: FakeRuntime) -> Iterator[LiveServer]:
    with live_server(make_settings(home), runtime) as live:
        yield live


def run(server: LiveServer, *args: str, env: dict[str, str] | None = None) -> Result:
    """Invoke the CLI with the server's URL and admin key in the environment."""
    base = {"GPUYARD_URL": server.url, "GPUYARD_API_KEY": server.key}
    base["GPUYARD_HOME"] = str(server.server.ctx.settings.home)
    return CliRunner().invoke(cli, list(args), env={**base, **(env or {})})


def ok_json(result: Result) -> Any:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def create(server: LiveServer, *extra: str) -> dict[str, Any]:
    result = run(
        server, "clusters", "create", "--name", "t", "--image", "busybox", "--gpu-type", A6000,
        "--gpu-count", "1", "--wait", "--json", *extra,
    )  # fmt: skip
    data: dict[str, Any] = ok_json(result)
    return data


def wait_status(server: LiveServer, cluster_id: str, status: str) -> dict[str, Any]:
    deadline = time.monotonic() + 10
    while True:
        data: dict[str, Any] = ok_json(run(server, "clusters", "get", cluster_id, "--json"))
        if data["status"] == status or time.monotonic() > deadline:
            return data
        time.sleep(0.1)


def test_create_wait_reaches_running_with_every_field(server: LiveServer) -> None:
    c = create(
        server, "--cpu-cores", "4", "--memory-gb", "16", "--container-disk-gb", "20",
        "--volume-gb", "5", "--volume-mount-path", "/data", "--args", "sleep 100",
        "--env", "A=1", "--env", "B=x=y", "--port", "8888/http", "--port", "22",
        "--cloud-type", "secure",
    )  # fmt: skip
    assert c["status"] == "running"
    assert c["gpu_count"] == 1 and c["gpu_type"] == A6000
    assert (c["cpu_cores"], c["memory_gb"], c["container_disk_gb"]) == (4, 16, 20)
    assert (c["volume_gb"], c["volume_mount_path"]) == (5, "/data")
    assert c["docker_args"] == "sleep 100"
    assert c["env"] == {"A": "1", "B": "x=y"}
    assert {(p["internal_port"], p["protocol"]) for p in c["ports"]} == {
        (8888, "http"),
        (22, "tcp"),
    }


def test_create_wait_human_output_shows_progress_and_cluster(server: LiveServer) -> None:
    result = run(server, "clusters", "create", "--image", "busybox", "--wait")
    assert result.exit_code == 0, result.output
    assert "running" in result.stderr  # progress lines (not a TTY: plain lines)
    assert "100%" in result.stderr
    assert "status:" in result.stdout and "running" in result.stdout


def test_create_wait_fails_when_the_image_fails(server: LiveServer, runtime: FakeRuntime) -> None:
    runtime.fail_image("broken", "manifest unknown")
    result = run(server, "clusters", "create", "--image", "broken", "--wait", "--timeout", "20")
    assert result.exit_code == 1, result.output
    assert "error: cluster" in result.stderr
    assert "manifest unknown" in result.stderr


def test_list_get_and_global_json(server: LiveServer) -> None:
    c = create(server)
    table = run(server, "clusters", "list")
    assert table.exit_code == 0, table.output
    header, *rows = table.stdout.splitlines()
    assert header.split()[:3] == ["ID", "NAME", "STATUS"]
    assert any(row.startswith(c["id"]) and "running" in row for row in rows)

    data = ok_json(run(server, "--json", "clusters", "list", "--status", "running"))
    assert [x["id"] for x in data["clusters"]] == [c["id"]]
    assert data["pagination"]["total"] == 1
    assert (
        ok_json(run(server, "clusters", "list", "--status", "stopped", "--json"))["clusters"] == []
    )
    none = run(server, "clusters", "list", "--search", "no-such-name")
    assert none.exit_code == 0 and "no clusters" in none.stdout

    human = run(server, "clusters", "get", c["id"])
    assert human.exit_code == 0, human.output
    assert c["id"] in human.stdout and "1 x" in human.stdout
    assert ok_json(run(server, "clusters", "get", c["id"], "--json"))["id"] == c["id"]


def test_stop_start_with_changes_and_terminate(server: LiveServer) -> None:
    c = create(server, "--memory-gb", "4")
    stop = run(server, "clusters", "stop", c["id"])
    assert stop.exit_code == 0, stop.output
    # "stopped" too: the woken reconciler may finish before the answer is read.
    assert stop.stdout.startswith((f"{c['id']}: stopping", f"{c['id']}: stopped"))
    assert wait_status(server, c["id"], "stopped")["status"] == "stopped"

    started = ok_json(
        run(
            server,
            "clusters",
            "start",
            c["id"],
            "--memory-gb",
            "8",
            "--cpu-cores",
            "3",
            "--env",
            "NEW=1",
            "--port",
            "9000:0/udp",
            "--wait",
            "--json",
        )
    )
    assert started["status"] == "running"
    assert (started["memory_gb"], started["cpu_cores"]) == (8, 3)
    assert started["env"]["NEW"] == "1"
    assert [(p["internal_port"], p["protocol"]) for p in started["ports"]] == [(9000, "udp")]

    restart = run(server, "clusters", "restart", c["id"], "--json")
    assert restart.exit_code == 0, restart.output
    assert wait_status(server, c["id"], "running")["status"] == "running"

    term = run(server, "clusters", "terminate", c["id"], "--json")
    assert ok_json(term)["status"] in ("terminating", "terminated")
    assert wait_status(server, c["id"], "terminated")["status"] == "terminated"

    events = run(server, "clusters", "events", c["id"])
    assert events.exit_code == 0, events.output
    assert "stop requested" in events.stdout and "-> terminated" in events.stdout
    assert ok_json(run(server, "clusters", "events", c["id"], "--json"))["events"]


def test_errors_exit_1_with_code_on_stderr(server: LiveServer) -> None:
    missing = run(server, "clusters", "get", "nosuchcluster1")
    assert missing.exit_code == 1
    assert missing.stderr.startswith("error: CLUSTER_NOT_FOUND: ")
    assert missing.stdout == ""

    c = create(server)
    again = run(server, "clusters", "start", c["id"])
    assert again.exit_code == 1
    assert "error: INVALID_STATE" in again.stderr and "current_status: running" in again.stderr

    bad = run(server, "clusters", "create", "--image", "x", "--env", "1BAD=v")
    assert bad.exit_code == 1 and "error: VALIDATION_ERROR" in bad.stderr

    unauth = run(server, "clusters", "list", env={"GPUYARD_API_KEY": "gy_wrong"})
    assert unauth.exit_code == 1 and "error: UNAUTHORIZED" in unauth.stderr
    assert "gy_wrong" not in unauth.output

    bad_port = run(server, "clusters", "create", "--image", "x", "--port", "80/sctp")
    assert bad_port.exit_code == 2 and "protocol" in bad_port.output


def test_unreachable_server_says_how_to_start_it(server: LiveServer) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    result = run(server, "--url", url, "clusters", "list")
    assert result.exit_code == 1
    assert f"not reachable at {url}" in result.stderr
    assert "gpuyard serve" in result.stderr and "Traceback" not in result.output


def test_credentials_file_is_used_without_env(server: LiveServer) -> None:
    home = server.server.ctx.settings.home
    result = CliRunner().invoke(
        cli, ["gpu-types", "--json"], env={"GPUYARD_HOME": str(home), "GPUYARD_URL": None,
                                           "GPUYARD_API_KEY": None},
    )  # fmt: skip
    types = {g["id"]: g for g in ok_json(result)["gpu_types"]}
    assert types[A6000]["total_gpus"] == 4

    table = run(server, "gpu-types")
    assert table.exit_code == 0 and A6000 in table.stdout


def test_hosts_needs_admin_and_shows_declared_gpus(server: LiveServer) -> None:
    result = run(server, "hosts")
    assert result.exit_code == 0, result.output
    # Free/total per GPU type, and where the GPUs came from.
    assert f"4/4 {A6000} (declared)" in result.stdout
    assert ok_json(run(server, "hosts", "--json"))["hosts"][0]["gpu_source"] == "declared"


def test_keys_create_list_revoke(server: LiveServer) -> None:
    created = run(server, "keys", "create", "--name", "ci", "--scope", "read")
    assert created.exit_code == 0, created.output
    key = created.stdout.strip().splitlines()[-1]
    assert key.startswith("gy_")
    with server.client(key) as http:
        assert http.get("/v1/clusters").status_code == 200
        denied = http.post("/v1/clusters", json={"docker_image": "x"})
        assert denied.status_code == 403

    listed = run(server, "keys", "list")
    assert listed.exit_code == 0, listed.output
    assert key[:10] in listed.stdout and "ci" in listed.stdout and "read" in listed.stdout
    assert key not in listed.stdout
    rows = ok_json(run(server, "keys", "list", "--json"))["keys"]
    assert [r["name"] for r in rows] == ["admin", "ci"]
    assert rows[1]["revoked_at"] is None

    revoked = run(server, "keys", "revoke", key[:10])
    assert revoked.exit_code == 0, revoked.output
    # The server caches resolved keys for a few seconds (api/state.py); skip the wait.
    server.server.app.state.gpuyard.keys.clear()
    with server.client(key) as http:
        assert http.get("/v1/clusters").status_code == 401
    assert ok_json(run(server, "keys", "list", "--json"))["keys"][1]["revoked_at"]

    missing = run(server, "keys", "revoke", "999")
    assert missing.exit_code == 1 and missing.stderr.startswith("error: NOT_FOUND")


def test_keys_create_before_first_start_explains(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["keys", "create"], env={"GPUYARD_HOME": str(tmp_path)})
    assert result.exit_code == 1
    assert "start the server once" in result.stderr


def test_write_key_from_cli_can_create(server: LiveServer) -> None:
    created = run(server, "keys", "create")
    key = created.stdout.strip().splitlines()[-1]
    result = run(
        server, "clusters", "create", "--image", "busybox", "--json", env={"GPUYARD_API_KEY": key}
    )
    assert ok_json(result)["status"] in ("pending", "starting", "running")
    assert httpx.get(f"{server.url}/healthz", verify=trusted_tls()).json()["ok"] is True


def test_spot_create_and_bid_resume(server: LiveServer) -> None:
    c = create(server, "--bid", "0.42")
    assert c["interruptible"] and c["bid_per_gpu"] == 0.42
    ok_json(run(server, "clusters", "stop", c["id"], "--json"))
    wait_status(server, c["id"], "stopped")
    low = run(server, "clusters", "bid-resume", c["id"], "--bid", "0.01")
    assert low.exit_code == 1 and "VALIDATION_ERROR" in low.stderr
    resumed = ok_json(
        run(server, "clusters", "bid-resume", c["id"], "--bid", "0.5", "--wait", "--json")
    )
    assert resumed["status"] == "running" and resumed["bid_per_gpu"] == 0.5


def test_billing_shows_spend_by_group(server: LiveServer) -> None:
    cluster = create(server)
    data = ok_json(run(server, "billing", "--group-by", "gpu_type", "--json"))
    assert data["group_by"] == "gpu_type" and data["currency"] == "USD"
    assert all(item["key"] == A6000 for item in data["items"])
    human = run(server, "billing", "--from", "2020-01-01")
    assert human.exit_code == 0, human.output
    assert "total:" in human.output and "USD" in human.output
    bad = run(server, "billing", "--from", "yesterday")
    assert bad.exit_code == 1 and "from" in bad.output
    assert cluster["id"]


@needs_tools("restic", how="apt-get install restic")
def test_snapshots_create_list_get_restore_clone_delete(server: LiveServer) -> None:
    c = create(server, "--volume-gb", "5")
    made = run(server, "snapshots", "create", c["id"], "--name", "nightly")
    assert made.exit_code == 0, made.output
    assert "status       ready" in made.stdout or "ready" in made.stdout
    assert "%" in made.stderr  # the progress line
    snaps = ok_json(run(server, "snapshots", "list", "--cluster", c["id"], "--json"))["snapshots"]
    assert [s["name"] for s in snaps] == ["nightly"] and snaps[0]["status"] == "ready"
    sid = snaps[0]["id"]
    listed = run(server, "snapshots")
    assert listed.exit_code == 0 and sid in listed.stdout and "crash_consistent" in listed.stdout
    assert ok_json(run(server, "snapshots", "get", sid, "--json"))["id"] == sid

    assert run(server, "clusters", "stop", c["id"]).exit_code == 0
    assert wait_status(server, c["id"], "stopped")["status"] == "stopped"
    started = run(
        server, "clusters", "start", c["id"], "--restore", sid, "--snapshot-first", "--wait"
    )
    assert started.exit_code == 0, started.output
    assert f"restore_from_snapshot: {sid}" in started.stderr
    assert "snapshot before changes: snap_" in started.stderr

    clone = create(server, "--snapshot", sid)
    assert clone["volume_gb"] == 5 and clone["status"] == "running"

    gone = run(server, "snapshots", "delete", sid)
    assert gone.exit_code == 0 and f"deleted snapshot {sid}" in gone.stdout
    missing = run(server, "snapshots", "get", sid)
    assert missing.exit_code == 1 and "SNAPSHOT_NOT_FOUND" in missing.stderr


def test_stop_wait_prints_the_stopped_cluster(server: LiveServer) -> None:
    c = create(server)
    stopped = ok_json(run(server, "clusters", "stop", c["id"], "--wait", "--json"))
    assert stopped["id"] == c["id"] and stopped["status"] == "stopped"
    again = run(server, "clusters", "stop", c["id"], "--wait", "--timeout", "5")
    assert again.exit_code == 1 and "INVALID_STATE" in again.output


def test_start_right_after_stop_waits_through_the_stop(
    server: LiveServer, runtime: FakeRuntime
) -> None:
    c = create(server)
    runtime.stop_gate = held = threading.Event()  # the start surely finds it stopping
    stop = run(server, "clusters", "stop", c["id"])
    assert stop.exit_code == 0 and stop.stdout.startswith(f"{c['id']}: stopping"), stop.output
    threading.Timer(0.5, held.set).start()  # the stop finishes while the start waits
    started = run(server, "clusters", "start", c["id"], "--wait", "--json", "--timeout", "30")
    held.set()
    assert started.exit_code == 0, started.output
    assert json.loads(started.stdout)["status"] == "running"
