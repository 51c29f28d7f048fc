"""The real server process (``gpuyard serve``) driving real Podman containers.

Every server a test starts is cleaned up by installation id only
(:meth:`ServerProcess.cleanup`): the engine may be shared with a dev server.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest

from gpuyard.core.ownership import LABEL_INSTALLATION, Ownership
from gpuyard.core.tls_trust import trusted_tls
from gpuyard.edge.caddy import CaddyProcess
from gpuyard.edge.proxy_resolver import ResolverProcess
from gpuyard.runtimes.engines.exec_output import run_keeping_output
from tests.e2e.conftest import DEV_IMAGE, purge_installation
from tests.e2e.serve_launcher import LAUNCHER, ForkedServer, can_fork
from tests.helpers import PORT_BLOCK_SIZE, free_port, migrated_sqlite, port_block
from tests.required_parts import needs_tools

pytestmark = [
    pytest.mark.e2e,
    needs_tools("podman", how="apt-get install podman runc (bash scripts/setup-system.sh)"),
]


class ServerProcess:
    def __init__(self, home: Path, engine_url: str, port: int) -> None:
        self.home, self.engine_url, self.port = home, engine_url, port
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen[bytes] | ForkedServer | None = None
        self.log = home / "server.log"
        self.extra_env: dict[str, str] = {}
        # Every installation id this process has had (a new home makes a new one):
        # what cleanup() may remove from the engine, and nothing else.
        self.installations: set[str] = set()
        self.port_block = port_block()

    def start(self) -> None:
        """Start the server and wait until it answers."""
        self.launch()
        self.wait_up()

    def launch(self) -> None:
        """Start the server's process without waiting for it (:meth:`wait_up`): servers
        launched together import and start side by side."""
        env = {
            **os.environ,
            "GPUYARD_HOME": str(self.home),
            "GPUYARD_PORT": str(self.port),
            "GPUYARD_ENGINE_URL": self.engine_url,
            "GPUYARD_LOCAL_GPUS": "NVIDIA RTX A6000:4",
            "GPUYARD_LOCAL_VCPUS": "32",
            "GPUYARD_LOCAL_MEMORY_GB": "256",
            "GPUYARD_LOCAL_DISK_GB": "1000",
            "GPUYARD_RECONCILE_INTERVAL_S": "0.5",
            "GPUYARD_STOP_TIMEOUT_S": "2",
            # The proxy and the SSH gateway listen on fixed ports: tests that want them
            # ask for them on free ports (extra_env).
            "GPUYARD_PROXY_ENABLED": "false",
            "GPUYARD_SSH_PORT": "0",
            # Published ports in a block of this server's own: a port another server
            # (or a container left by a killed run) holds on this machine is not
            # handed out again here.
            "GPUYARD_PORT_RANGE_START": str(self.port_block),
            "GPUYARD_PORT_RANGE_END": str(self.port_block + PORT_BLOCK_SIZE - 1),
            # This machine's engine storage is on ext4 (no project quotas): container
            # disk sizes cannot be enforced here. Volumes are still sized (loop-mounted
            # images); tests of the refusal itself set this to false.
            "GPUYARD_ALLOW_UNENFORCED_DISK": "true",
            **self.extra_env,
        }
        self.home.mkdir(parents=True, exist_ok=True)
        if "GPUYARD_DATABASE_URL" not in env and not self.db_path.exists():
            # A new home gets a copy of the process's migrated template (its own
            # installation id): the start skips the migrations, seconds of CPU each.
            migrated_sqlite(self.db_path)
        if can_fork(env):
            # Forked from a process that has imported the server (seconds of CPU less
            # a start): tests/e2e/serve_launcher.py.
            self.proc = LAUNCHER.serve(env, self.log)
            return
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "gpuyard", "serve"],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def wait_up(self) -> None:
        """Wait until the launched server answers (failing with its log's end if it
        does not within a minute, or exits)."""
        assert self.proc is not None, "not launched"
        # Importing and migrating take seconds; on a loaded two-core machine, tens.
        deadline = time.monotonic() + 60
        # One client for every try: a new one each time loads the CA bundle (tens of
        # milliseconds of CPU, taken from the server starting beside it).
        with httpx.Client(timeout=1, trust_env=False, verify=trusted_tls()) as probe:
            while time.monotonic() < deadline:
                try:
                    # Ours answers only once its database exists (an answer before that
                    # would be another server's: then ours fails to bind and says so; a
                    # copied template database only exists earlier, and the port is
                    # from this process's own block).
                    up = probe.get(self.url + "/healthz").status_code == 200
                    if up and self.db_path.exists():
                        self.installations.add(self.installation.installation_id)
                        return
                except httpx.HTTPError:
                    pass
                assert self.proc.poll() is None, self.log.read_text()[-3000:]
                time.sleep(0.1)
        # Stopped before the failure: a caller whose start() raised does not clean up a
        # server it never had, which would otherwise outlive the test run.
        self.stop()
        raise AssertionError("server did not come up:\n" + self.log.read_text()[-3000:])

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def cleanup(self) -> None:
        """Stop the server, then remove what its installations left on the engine
        (a test that failed half-way leaves containers and volumes behind)."""
        self.stop()
        # A Caddy this server started outlives a kill -9 of the server (by design), and
        # so does the resolver it routes by.
        CaddyProcess(self.home / "caddy").stop()
        ResolverProcess(self.home / "caddy").stop()
        for installation_id in sorted(self.installations):
            purge_installation(self.engine_url, installation_id)

    def log_tail(self, chars: int = 3000) -> str:
        """The end of the server's log, for a failure's message."""
        return self.log.read_text(errors="replace")[-chars:]

    @property
    def db_path(self) -> Path:
        return self.home / "gpuyard.db"

    @property
    def installation(self) -> Ownership:
        """This server's installation identity, read from its database (the one row of
        the ``installation`` table); it names and labels everything it makes."""
        db = sqlite3.connect(f"file:{self.db_path}?mode=ro", uri=True, timeout=10)
        try:
            row = db.execute("SELECT uuid FROM installation ORDER BY id LIMIT 1").fetchone()
        finally:
            db.close()
        assert row is not None, f"no installation id in {self.db_path}"
        return Ownership(str(row[0]))

    @property
    def key(self) -> str:
        key: str = json.loads((self.home / "credentials").read_text())["api_key"]
        return key

    def client(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {self.key}"},
            timeout=120,
            verify=trusted_tls(),
        )


@contextmanager
def running_server(
    home: Path, engine_url: str, env: dict[str, str] | None = None
) -> Iterator[ServerProcess]:
    server = ServerProcess(home, engine_url, free_port())
    server.extra_env = dict(env or {})
    try:
        server.start()
        yield server
    finally:
        server.cleanup()


def container_name(server: ServerProcess, cid: str) -> str:
    """The engine name of cluster ``cid``'s container on ``server``."""
    return server.installation.container(cid)


def volume_name(server: ServerProcess, cid: str) -> str:
    """The engine name of cluster ``cid``'s volume on ``server``."""
    return server.installation.volume(cid)


def wait_status(c: httpx.Client, cid: str, want: set[str], timeout: float = 60) -> dict[str, Any]:
    """Poll cluster ``cid`` until its status is one of ``want``; on timeout the
    failure says where it stands and how it got there (its events), first."""
    deadline = time.monotonic() + timeout
    while True:
        data: dict[str, Any] = c.get(f"/v1/clusters/{cid}").json()["data"]
        if data["status"] in want:
            return data
        assert time.monotonic() < deadline, why_not(c, cid, want, data)
        time.sleep(0.1)


def why_not(c: httpx.Client, cid: str, want: set[str], data: dict[str, Any]) -> str:
    """A timed-out wait's message: status, reason and the cluster's event history."""
    events = (c.get(f"/v1/clusters/{cid}/events").json().get("data") or {}).get("events", [])
    history = "\n".join(f"  {e['at']} {e['type']}: {e['message']}" for e in events)
    return (
        f"cluster {cid} is {data['status']!r}, not one of {sorted(want)}: "
        f"{data.get('last_status_change')!r}; error_message={data.get('error_message')!r}\n"
        f"events:\n{history}"
    )


def sh(
    engine: docker.DockerClient, server: ServerProcess, cid: str, command: str
) -> tuple[int, str]:
    """Run ``command`` in cluster ``cid``'s container on ``server`` (:func:`sh_in`)."""
    return sh_in(engine.containers.get(container_name(server, cid)), command)


def sh_in(container: Any, command: str) -> tuple[int, str]:
    """Run ``command`` in ``container``: (exit code, output). The command must be safe
    to repeat: it is run again when the engine lost its output
    (runtimes/engines/exec_output.py)."""

    def once(argv: list[str]) -> tuple[int, str]:
        code, out = container.exec_run(argv)
        return int(code), out.decode()

    return run_keeping_output(once, ["sh", "-c", command])


def gone(engine: docker.DockerClient, server: ServerProcess, cid: str) -> bool:
    """True when cluster ``cid`` of ``server`` has no container (in any state)."""
    name = container_name(server, cid)
    listed = engine.containers.list(all=True, filters={"name": name})
    return not [c for c in listed if c.name == name]


def http_get(url: str, timeout: float = 10) -> str:
    """GET with retries: "running" means the container's process runs; the service
    inside may need a moment more to listen."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                body: bytes = r.read()
                return body.decode()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_cluster_lifecycle_on_real_containers(
    tmp_path: Path, engine_url: str, engine: docker.DockerClient
) -> None:
    with running_server(tmp_path / "home", engine_url) as server, server.client() as c:
        r = c.post(
            "/v1/clusters",
            json={
                "name": "e2e",
                "gpu_type": "NVIDIA RTX A6000",
                "gpu_count": 2,
                "docker_image": DEV_IMAGE,
                "env": {"GREETING": "hello"},
                "ports": [{"internal_port": 8888, "external_port": 0, "protocol": "http"}],
                "volume_gb": 1,
                "memory_gb": 1,
                "cpu_cores": 1,
            },
        )
        assert r.status_code == 201, r.text
        cid = r.json()["data"]["id"]
        data = wait_status(c, cid, {"running", "error"})
        assert data["status"] == "running", data
        port = data["ports"][0]["external_port"]
        # The proxy is off here (test_proxy_e2e.py covers it): no proxy URL, and a
        # private http port has no address (it answers on the host's loopback only).
        assert data["network"]["proxy_url"] is None
        assert data["network"]["ports"][0]["address"] is None

        container = engine.containers.get(container_name(server, cid))
        env = dict(e.split("=", 1) for e in container.attrs["Config"]["Env"])
        assert env["GREETING"] == "hello"
        assert env["CUDA_VISIBLE_DEVICES"] == "0,1" == env["NVIDIA_VISIBLE_DEVICES"]
        assert container.labels["gpuyard.cluster_id"] == cid
        assert container.labels[LABEL_INSTALLATION] == server.installation.installation_id
        try:
            answer = http_get(f"http://127.0.0.1:{port}/", timeout=30)
        except OSError as exc:
            container.reload()
            ss = subprocess.run(["ss", "-H", "-l", "-n", "-t"], capture_output=True, text=True)
            pytest.fail(
                f"port {port}: {exc}; container {container.attrs['State']}, ports "
                f"{container.attrs['NetworkSettings']['Ports']}; listening: "
                f"{[line for line in ss.stdout.splitlines() if f':{port} ' in line]}; "
                f"server log: {server.log_tail()}"
            )
        assert f"host: {cid}" in answer

        write = "echo kept > /workspace/kept.txt; echo gone > /root/scratch"
        assert sh(engine, server, cid, write)[0] == 0

        assert c.post(f"/v1/clusters/{cid}/stop").status_code == 200
        wait_status(c, cid, {"stopped"})
        assert gone(engine, server, cid)

        r = c.post(
            f"/v1/clusters/{cid}/start",
            json={
                "wait_for_ready": True,
                "timeout_minutes": 2,
                "update_configuration": {"memory_gb": 2},
                "environment_updates": {"BATCH_SIZE": "64"},
            },
        )
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["data"]["status"] == "running" and body["meta"]["wait_timed_out"] is False
        assert body["data"]["configuration_updates_applied"][0] == "memory_gb: 1 -> 2"
        assert sh(engine, server, cid, "cat /workspace/kept.txt") == (0, "kept\n")
        assert sh(engine, server, cid, "test -e /root/scratch")[0] != 0
        assert sh(engine, server, cid, "echo $BATCH_SIZE $GREETING") == (0, "64 hello\n")
        container = engine.containers.get(container_name(server, cid))
        assert container.attrs["HostConfig"]["Memory"] == 2 * 1024**3
        assert data["ports"][0]["external_port"] == port  # stable across stop/start

        events = c.get(f"/v1/clusters/{cid}/events").json()["data"]["events"]
        assert [e["to_status"] for e in events][:4] == [
            "starting",
            "running",
            "stopping",
            "stopped",
        ]

        assert c.delete(f"/v1/clusters/{cid}").status_code == 200
        wait_status(c, cid, {"terminated"})
        assert gone(engine, server, cid)
        assert not [v for v in engine.volumes.list() if v.name == volume_name(server, cid)]


def test_missing_image_fails_with_clear_error(tmp_path: Path, engine_url: str) -> None:
    with running_server(tmp_path / "home", engine_url) as server, server.client() as c:
        r = c.post("/v1/clusters", json={"docker_image": "localhost/gpuyard/nope:1"})
        data = wait_status(c, r.json()["data"]["id"], {"error", "running"})
        assert data["status"] == "error"
        assert "localhost/gpuyard/nope:1" in data["error_message"]


def test_kill9_while_starting_converges(
    tmp_path: Path, engine_url: str, engine: docker.DockerClient
) -> None:
    home = tmp_path / "home"
    server = ServerProcess(home, engine_url, free_port())
    server.start()
    ids = []
    with server.client() as c:
        for i in range(4):
            r = c.post(
                "/v1/clusters",
                json={
                    "name": f"k{i}",
                    "gpu_type": "NVIDIA RTX A6000",
                    "gpu_count": 1,
                    "docker_image": DEV_IMAGE,
                    "volume_gb": 1,
                },
            )
            assert r.status_code == 201, r.text
            ids.append(r.json()["data"]["id"])
    server.kill9()
    server.start()
    try:
        with server.client() as c:
            final = {cid: wait_status(c, cid, {"running", "error"}, timeout=90) for cid in ids}
            assert all(d["status"] == "running" for d in final.values()), final
            # Terminate one and kill again mid-terminate: it still converges.
            c.delete(f"/v1/clusters/{ids[0]}")
        server.kill9()
        server.start()
        with server.client() as c:
            wait_status(c, ids[0], {"terminated"}, timeout=60)
            running = {cid for cid in ids[1:]}
            for cid in running:
                assert wait_status(c, cid, {"running"})["status"] == "running"
        labelled = {
            ct.labels["gpuyard.cluster_id"]
            for ct in engine.containers.list(
                all=True, filters={"label": server.installation.label_filter()}
            )
            if ct.labels.get("gpuyard.cluster_id") in ids
        }
        assert labelled == running
        db = sqlite3.connect(home / "gpuyard.db")
        held = db.execute("SELECT cluster_id, gpu_index FROM gpu_allocations").fetchall()
        db.close()
        assert {cid for cid, _ in held} == running
        assert len({idx for _, idx in held}) == len(held) == 3
    finally:
        with server.client() as c:
            for cid in ids:
                c.delete(f"/v1/clusters/{cid}")
            for cid in ids:
                wait_status(c, cid, {"terminated"}, timeout=60)
        server.cleanup()


def test_preempted_spot_cluster_keeps_its_volume(
    tmp_path: Path, engine_url: str, engine: docker.DockerClient
) -> None:
    spot = {"gpu_type": "NVIDIA RTX A6000", "gpu_count": 4, "docker_image": DEV_IMAGE,
            "volume_gb": 1, "interruptible": True, "bid_per_gpu": 0.40}  # fmt: skip
    with running_server(tmp_path / "home", engine_url) as server, server.client() as c:
        low = c.post("/v1/clusters", json=spot).json()["data"]["id"]
        wait_status(c, low, {"running"})
        assert sh(engine, server, low, "echo epoch-7 > /workspace/ckpt")[0] == 0
        boss = c.post(
            "/v1/clusters",
            json={"gpu_type": "NVIDIA RTX A6000", "gpu_count": 4, "docker_image": DEV_IMAGE},
        ).json()["data"]["id"]
        assert "preempted by" in wait_status(c, low, {"stopped"})["last_status_change"]
        assert wait_status(c, boss, {"running", "error"})["status"] == "running"
        assert gone(engine, server, low)
        c.delete(f"/v1/clusters/{boss}")
        wait_status(c, boss, {"terminated"})
        r = c.post(f"/v1/clusters/{low}/bid-resume", json={"bid_per_gpu": 0.45})
        assert r.status_code == 200, r.text
        wait_status(c, low, {"running"})
        assert sh(engine, server, low, "cat /workspace/ckpt") == (0, "epoch-7\n")
        c.delete(f"/v1/clusters/{low}")
        wait_status(c, low, {"terminated"})


def test_auto_termination_really_stops_containers(
    tmp_path: Path, engine_url: str, engine: docker.DockerClient
) -> None:
    server = ServerProcess(tmp_path / "home", engine_url, free_port())
    server.extra_env = {"GPUYARD_IDLE_SAMPLE_INTERVAL_S": "0.5", "GPUYARD_IDLE_CPU_PERCENT": "20"}
    server.start()
    try:
        with server.client() as c:
            base = {"docker_image": DEV_IMAGE, "cpu_cores": 1, "memory_gb": 1}
            short = c.post("/v1/clusters", json={
                **base, "auto_terminate": {"enabled": True, "max_runtime_hours": 0.001}
            }).json()["data"]["id"]  # fmt: skip
            idle = c.post("/v1/clusters", json={
                **base, "auto_terminate": {"enabled": True, "idle_minutes": 0.05}
            }).json()["data"]["id"]  # fmt: skip
            # The runtime counts from the create (as billing does): 3.6 s. A cluster
            # still starting then is stopped once it runs (auto-termination fires only
            # on a running cluster), and the stop may follow "running" within one poll.
            stopped = wait_status(c, short, {"stopped"}, timeout=90)
            assert "max runtime 0.001 h reached" in stopped["last_status_change"]
            stopped = wait_status(c, idle, {"stopped"}, timeout=90)
            assert "idle for 0.05 min" in stopped["last_status_change"]
            for cid in (short, idle):
                assert gone(engine, server, cid)
                c.delete(f"/v1/clusters/{cid}")
    finally:
        server.cleanup()
