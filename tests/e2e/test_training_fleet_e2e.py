"""A training cluster placed on a remote host runs there: the real server with real
Slurm nodes, one simulated host reached over SSH (its own network namespace, Podman
with its own storage that starts without the node image, and sshd), and this
machine's engine holding nothing of the cluster. The node image is copied to the host
through its engine, and Slurm schedules a job on the host's worker.

Slurm is driven here through the host's engine (``srun`` in the controller); the
cluster's SSH port answers on the host's address and an attached reserved IP on the
host itself, both served by DNAT rules in the host's kernel (runtimes/hosts/edge.py).
Root, podman and sshd needed; builds the Slurm node image when this machine's engine
lacks it."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from gpuyard.runtimes.slurm.image import SLURM_IMAGE
from tests.e2e.podman_host import HOSTS_HOW, available
from tests.e2e.training_fleet import (
    BASE,
    TrainingFleet,
    create_training,
    detail,
    node_containers,
    scope_of,
    training_fleet,
    wait,
    wait_running,
)
from tests.required_parts import needs

pytestmark = [pytest.mark.e2e, needs("simulated hosts", available(), how=HOSTS_HOW)]


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


@pytest.fixture(scope="module")
def remote(tmp_path_factory: pytest.TempPathFactory, engine_url: str) -> Iterator[TrainingFleet]:
    home = Path(tmp_path_factory.mktemp("training-fleet")) / "home"
    with training_fleet(
        home, engine_url, 1, training_ready_timeout_s=240.0, reserved_ips="127.0.10.0/29"
    ) as fleet:
        yield fleet


def test_a_training_cluster_on_a_remote_host_runs_there_only(
    remote: TrainingFleet, engine_url: str
) -> None:
    [host_id] = remote.hosts
    with remote.server.client() as c:
        params = scope_of(c)
        cid = create_training(c, params, "far", workers=1, gpus_per_node=1)
        wait_running(c, cid, params, 600)
        # The image was copied to the host.
        host_image = remote.api(host_id).inspect_image(SLURM_IMAGE)
        here = docker.DockerClient(base_url=engine_url)
        try:
            assert host_image["Id"] == here.api.inspect_image(SLURM_IMAGE)["Id"]
            # No node of the cluster on this machine's engine.
            assert node_containers(here, remote.server.server.ctx.ownership, cid) == []
        finally:
            here.close()
        prefix = remote.server.server.ctx.ownership.training_prefix(cid)
        on_host = remote.labelled(host_id, cid)
        assert on_host == {f"{prefix}-controller", f"{prefix}-worker-1"}, on_host
        # Slurm runs a job on the host's worker.
        code, out = remote.exec(host_id, f"{prefix}-controller", ["srun", "-N1", "hostname"])
        assert code == 0 and out.strip() == f"{prefix}-worker-1", out

        # SSH is served on the host the controller runs on, and named so.
        sim = remote.hosts[host_id]
        data = detail(c, cid, params)
        port = data["ssh"]["port"]
        assert data["ssh"]["host"] == sim.address, data["ssh"]
        assert data["ssh"]["command"] == f"ssh -p {port} root@{sim.address}"
        wait(lambda: banner(sim.address, port), 30, "the SSH port on the host")
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
        wait(lambda: banner(address, 22, sim.nsenter()), 30, "the reserved IP on the host")
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
        wait(lambda: not banner(sim.address, port), 30, "this machine refused")
        r = c.put(
            f"{BASE}{cid}/",
            params=params,
            json={"action": "remove_security_group", "security_group_id": group["id"]},
        )
        assert r.status_code == 200, r.text
        wait(lambda: banner(sim.address, port), 30, "open again")

        assert c.delete(f"{BASE}{cid}/", params=params).status_code in (200, 202, 204)
        wait(lambda: not remote.labelled(host_id, cid), 120, "the nodes removed from the host")
