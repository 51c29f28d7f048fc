"""A training cluster placed on a remote host runs there: the real server with real
Slurm nodes, one simulated host reached over SSH (its own network namespace, Podman
with its own storage that starts without the node image, and sshd), and this
machine's engine holding nothing of the cluster. The node image is copied to the host
through its engine, and Slurm schedules a job on the host's worker.

Root, podman and sshd needed; builds the Slurm node image when this machine's engine
lacks it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from gpuyard.runtimes.slurm_image import SLURM_IMAGE
from tests.e2e.podman_host import available
from tests.e2e.training_fleet import (
    BASE,
    LABEL_TRAINING,
    TrainingFleet,
    create_training,
    scope_of,
    training_fleet,
    wait,
    wait_running,
)

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(available() is not None, reason=str(available()))]


@pytest.fixture(scope="module")
def remote(tmp_path_factory: pytest.TempPathFactory, engine_url: str) -> Iterator[TrainingFleet]:
    home = Path(tmp_path_factory.mktemp("training-fleet")) / "home"
    with training_fleet(home, engine_url, 1, training_ready_timeout_s=240.0) as fleet:
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
            mine = {"label": f"{LABEL_TRAINING}={cid}"}
            assert here.containers.list(all=True, filters=mine) == []
        finally:
            here.close()
        prefix = remote.server.server.ctx.ownership.training_prefix(cid)
        on_host = remote.labelled(host_id, cid)
        assert on_host == {f"{prefix}-controller", f"{prefix}-worker-1"}, on_host
        # Slurm runs a job on the host's worker.
        code, out = remote.exec(host_id, f"{prefix}-controller", ["srun", "-N1", "hostname"])
        assert code == 0 and out.strip() == f"{prefix}-worker-1", out

        assert c.delete(f"{BASE}{cid}/", params=params).status_code in (200, 202, 204)
        wait(lambda: not remote.labelled(host_id, cid), 120, "the nodes removed from the host")
