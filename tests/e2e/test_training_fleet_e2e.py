"""A training cluster placed on a remote host runs there: the real server with real
Slurm nodes, one simulated host reached over SSH (its own network namespace, Podman
with its own storage that starts without the node image, and sshd), and this
machine's engine holding nothing of the cluster. The node image is copied to the host
through its engine, and Slurm schedules a job on the host's worker.

Slurm is driven here through the host's engine (``srun`` in the controller); the
cluster's SSH port answers on the host's address and an attached reserved IP on the
host itself, both served by DNAT rules in the host's kernel (runtimes/host_edge.py).
Root, podman and sshd needed; builds the Slurm node image when this machine's engine
lacks it."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest

from gpuyard.api.app import training_operator_factory
from gpuyard.runtimes.docker_engine import DockerEngineRuntime
from gpuyard.runtimes.engine import Engine, EnginePolicy
from gpuyard.runtimes.host_runtimes import host_runtime_factory
from gpuyard.runtimes.slurm_image import SLURM_IMAGE, build_slurm_image
from gpuyard.runtimes.ssh_tunnel import SshKeys
from tests.e2e.conftest import purge_installation
from tests.e2e.podman_host import PodmanHost, available
from tests.helpers import LiveServer, live_server, make_settings

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(available() is not None, reason=str(available()))]

A6000 = "NVIDIA RTX A6000"
BASE = "/distributed_jobs_v2/cluster/"
LABEL_TRAINING = "gpuyard.training_cluster_id"


def wait(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def banner(host: str, port: int, inside: list[str] | None = None) -> bool:
    """Whether a TCP connection to ``host:port`` gets an SSH banner, made from this
    machine or, with ``inside``, from the command prefix that enters a host."""
    probe = (
        "import socket, sys\n"
        "s = socket.create_connection((sys.argv[1], int(sys.argv[2])), 5)\n"
        "s.settimeout(5)\n"
        "sys.exit(0 if s.recv(64).startswith(b'SSH-') else 1)\n"
    )
    argv = [*(inside or []), sys.executable, "-c", probe, host, str(port)]
    return subprocess.run(argv, capture_output=True, timeout=30).returncode == 0


class Remote:
    def __init__(self, server: LiveServer, host_id: int, sim: PodmanHost) -> None:
        self.server = server
        self.host_id = host_id
        self.sim = sim

    def engine(self) -> Engine:
        runtime = self.server.server.reconciler.fleet.for_host(self.host_id)
        assert isinstance(runtime, DockerEngineRuntime)
        return runtime.engine

    def exec(self, container: str, argv: list[str]) -> tuple[int, str]:
        api = self.engine().api
        run = api.exec_create(container, argv)
        out = api.exec_start(run["Id"])
        return int(api.exec_inspect(run["Id"]).get("ExitCode") or 0), out.decode(errors="replace")


@pytest.fixture(scope="module")
def remote(tmp_path_factory: pytest.TempPathFactory, engine_url: str) -> Iterator[Remote]:
    try:
        build_slurm_image("podman", SLURM_IMAGE)
    except Exception as exc:  # no debootstrap / no mirror: say why
        pytest.fail(f"cannot build the Slurm node image: {exc}")
    home = Path(tmp_path_factory.mktemp("training-fleet")) / "home"
    keys = SshKeys(home)
    settings = make_settings(
        home,
        local_gpus="",
        heartbeat_interval_s=1.0,
        training_ready_timeout_s=240.0,
        rate_limit_per_key=0,
        rate_limit_per_source=0,
        reserved_ips="127.0.10.0/29",
    )
    policy = EnginePolicy()
    sim = PodmanHost(ssh_key=keys.public_key())
    try:
        sim.start()
        local = DockerEngineRuntime(engine_url, policy=policy)
        factory = host_runtime_factory(home, policy, settings.remote_engine_timeout_s)
        operator = training_operator_factory(settings, engine_url)
        with live_server(settings, local, factory, operator) as server:
            try:
                with server.client() as c:
                    # Nothing lands on this machine: the cluster must go to the host.
                    assert c.post("/v1/hosts/1/cordon").status_code == 200
                    r = c.post(
                        "/v1/hosts",
                        json={"name": "sim", "engine_url": sim.ssh_url, "gpus": f"{A6000}:2",
                              "location": "lab", "vcpus": 16, "memory_gb": 32},
                    )  # fmt: skip
                    assert r.status_code == 201, r.text
                    host_id = r.json()["data"]["id"]

                    def reachable() -> bool:
                        hosts = c.get("/v1/hosts").json()["data"]["hosts"]
                        found = next(h for h in hosts if h["id"] == host_id)
                        return bool(found["reachability"] == "reachable")

                    wait(reachable, 60, "the host's first heartbeat")
                yield Remote(server, host_id, sim)
            finally:
                purge_installation(engine_url, server.server.ctx.ownership.installation_id)
    finally:
        sim.close()


def cluster(c: httpx.Client, cid: int, params: dict[str, Any]) -> dict[str, Any]:
    r = c.get(f"{BASE}{cid}/", params=params)
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()["data"]
    return data


def test_a_training_cluster_on_a_remote_host_runs_there_only(
    remote: Remote, engine_url: str
) -> None:
    ssh_key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGe4tciPtcKsqalQ5MYQNCKBAGbS1rO94qvBwyD7hpHy k1"
    with remote.server.client() as c:
        projects = c.get("/v1/projects").json()["data"]
        projects = projects if isinstance(projects, list) else projects["projects"]
        params = {"project_id": projects[0]["id"], "location": "lab"}
        key = c.post("/v1/ssh-keys", json={"name": "k", "public_key": ssh_key}).json()["data"]
        images = c.get("/v1/images").json()["data"]
        images = images if isinstance(images, list) else images["images"]
        base = next(i for i in images if i["image"] == SLURM_IMAGE)
        created = c.post(
            BASE,
            params=params,
            json={"name": "far", "image_version_id": base["id"], "ssh_key_ids": [key["id"]],
                  "no_of_nodes": 1, "gpu_type": A6000, "gpus_per_node": 1,
                  "cpus_per_node": 1, "memory_gb_per_node": 1},
        )  # fmt: skip
        assert created.status_code == 201, created.text
        cid = created.json()["data"]["id"]
        reasons: set[str] = set()

        def running() -> bool:
            data = cluster(c, cid, params)
            reasons.add(str(data.get("status_reason") or ""))
            assert data["status"] != "error", data
            return bool(data["status"] == "running")

        wait(running, 600, "the cluster running")
        # The image was copied to the host.
        host_image = remote.engine().api.inspect_image(SLURM_IMAGE)
        here = docker.DockerClient(base_url=engine_url)
        try:
            assert host_image["Id"] == here.api.inspect_image(SLURM_IMAGE)["Id"]
            # No node of the cluster on this machine's engine.
            assert (
                here.containers.list(all=True, filters={"label": f"{LABEL_TRAINING}={cid}"}) == []
            )
        finally:
            here.close()
        on_host = {
            row["Names"][0].lstrip("/")
            for row in remote.engine().api.containers(
                all=True, filters={"label": f"{LABEL_TRAINING}={cid}"}
            )
        }
        prefix = remote.server.server.ctx.ownership.training_prefix(cid)
        assert on_host == {f"{prefix}-controller", f"{prefix}-worker-1"}, on_host
        # Slurm runs a job on the host's worker.
        code, out = remote.exec(f"{prefix}-controller", ["srun", "-N1", "hostname"])
        assert code == 0 and out.strip() == f"{prefix}-worker-1", out

        # SSH is served on the host the controller runs on, and named so.
        data = cluster(c, cid, params)
        port = data["ssh"]["port"]
        assert data["ssh"]["host"] == remote.sim.address, data["ssh"]
        assert data["ssh"]["command"] == f"ssh -p {port} root@{remote.sim.address}"
        wait(lambda: banner(remote.sim.address, port), 30, "the SSH port on the host")
        # A reserved IP reaches the controller on the host (a loopback address here,
        # so it is tried from inside the host).
        ip = c.post("/v1/reserved-ips", params={"project_id": params["project_id"]}).json()
        r = c.put(
            f"{BASE}{cid}/",
            params=params,
            json={"action": "attach_ip", "reserved_ip_id": ip["data"]["id"]},
        )
        assert r.status_code == 200, r.text
        address = ip["data"]["address"]
        wait(lambda: banner(address, 22, remote.sim.nsenter()), 30, "the reserved IP on the host")
        assert not banner(address, 22)  # not on this machine
        # A security group is enforced there too: this machine is not an allowed source.
        group = c.post(
            "/v1/security-groups",
            json={
                "name": "elsewhere",
                "rules": [{"protocol": "tcp", "port_range": "22", "source_cidr": "192.0.2.0/24"}],
            },
        ).json()["data"]
        r = c.put(
            f"{BASE}{cid}/",
            params=params,
            json={"action": "add_security_group", "security_groups_ids": [group["id"]]},
        )
        assert r.status_code == 200, r.text
        wait(lambda: not banner(remote.sim.address, port), 30, "this machine refused")
        r = c.put(
            f"{BASE}{cid}/",
            params=params,
            json={"action": "remove_security_group", "security_group_id": group["id"]},
        )
        assert r.status_code == 200, r.text
        wait(lambda: banner(remote.sim.address, port), 30, "open again")

        assert c.delete(f"{BASE}{cid}/", params=params).status_code in (200, 202, 204)

        def gone() -> bool:
            rows = remote.engine().api.containers(
                all=True, filters={"label": f"{LABEL_TRAINING}={cid}"}
            )
            return not rows

        wait(gone, 120, "the cluster's nodes removed from the host")
