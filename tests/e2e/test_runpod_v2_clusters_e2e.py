"""A RunPod v2 SLURM cluster on real Slurm: created through ``POST /runpod/v2/clusters``
on the real server (``gpuyard serve``) with real Podman node containers, reached over
SSH with the key set by ``PUT /runpod/v2/account/ssh-keys`` (``srun`` on both GPU
nodes), then deleted through ``DELETE /runpod/v2/clusters/{id}``, after which none of
its containers is left. One create and one delete: the actions are
tests/e2e/test_training_e2e.py's."""

from __future__ import annotations

from pathlib import Path

import docker
import pytest

from tests.e2e.test_server_e2e import ServerProcess
from tests.e2e.test_training_e2e import Ssh, until

# Fixtures of the training end-to-end test (imported: pytest finds them here).
from tests.e2e.test_training_e2e import server as server
from tests.e2e.test_training_e2e import slurm_images as slurm_images

pytestmark = pytest.mark.e2e

V2 = "/runpod/v2"


def test_v2_slurm_cluster_on_real_slurm(
    server: ServerProcess,
    engine_url: str,
    tmp_path: Path,
) -> None:
    engine = docker.DockerClient(base_url=engine_url)
    ssh = Ssh(tmp_path)
    key, pub = ssh.keygen("v2")
    with server.client() as c:
        assert c.put(f"{V2}/account/ssh-keys", json={"keys": [pub]}).status_code == 200
        body = {
            "name": "v2-e2e",
            "type": "SLURM",
            "compute": {"gpuTypeId": "NVIDIA RTX A6000", "gpuCountPerPod": 1, "podCount": 2},
        }
        r = c.post(f"{V2}/clusters", json=body)
        assert r.status_code == 201, r.text
        cid = r.json()["id"]

        def primary() -> dict[str, str] | None:
            got = c.get(f"{V2}/clusters/{cid}").json()
            running = got["pods"]["byStatus"].get("RUNNING") == got["pods"]["total"]
            return got["primary"] if running and got.get("primary") else None

        endpoint = until(primary, timeout=300, what="the cluster's nodes running")
        pods = c.get(f"{V2}/clusters/{cid}/pods").json()["pods"]
        port = pods[0]["ssh"]["direct"]["port"]
        assert endpoint["sshEndpoint"].endswith(f":{port}")
        workers = sorted(p["name"] for p in pods if p["cluster"]["role"] == "SLURM_COMPUTE")

        out = until(
            lambda: (
                (run := ssh.run(key, "127.0.0.1", port, "srun -N2 hostname")).returncode == 0
                and run
            ),
            timeout=120,
            what="srun over SSH",
        )
        assert sorted(out.stdout.split()) == workers

        assert c.delete(f"{V2}/clusters/{cid}").status_code == 204
        prefix = server.installation.training_prefix(int(cid))

        def nothing_left() -> bool:
            names = [x.name for x in engine.containers.list(all=True)]
            return not any(n.startswith(prefix) for n in names)

        until(nothing_left, timeout=180, what="the cluster's containers removed")
        assert c.get(f"{V2}/clusters/{cid}").status_code == 404
