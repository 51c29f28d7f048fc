"""What the training e2e tests on simulated fleet hosts share: the real server with the
training operator, hosts made by tests/e2e/podman_host.py and added through the API
(this machine's own host cordoned, so nothing of a cluster lands here), and the calls
a user makes to create a training cluster and wait for it."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest

from gpuyard.api.engine_server import training_operator_factory
from gpuyard.core.ownership import Ownership
from gpuyard.runtimes.engines.engine import EnginePolicy
from gpuyard.runtimes.engines.runtime import DockerEngineRuntime
from gpuyard.runtimes.hosts.runtimes import host_runtime_factory
from gpuyard.runtimes.hosts.ssh_tunnel import SshKeys
from gpuyard.runtimes.slurm.image import SLURM_IMAGE, build_slurm_image
from tests.e2e.conftest import purge_installation
from tests.e2e.podman_host import PodmanHost
from tests.helpers import LiveServer, live_server, make_settings

A6000 = "NVIDIA RTX A6000"
BASE = "/distributed_jobs_v2/cluster/"
LABEL_TRAINING = "gpuyard.training_cluster_id"
SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGe4tciPtcKsqalQ5MYQNCKBAGbS1rO94qvBwyD7hpHy k1"


def node_containers(engine: docker.DockerClient, owner: Ownership, cid: int) -> list[str]:
    """The containers of training cluster ``cid`` of installation ``owner`` on
    ``engine``, as ``name (state)``. Scoped by the installation: training cluster ids
    count from 1 in every installation, and another one may share the engine."""
    labels = [owner.label_filter(), f"{LABEL_TRAINING}={cid}"]
    return [
        f"{ct.name} ({ct.status})"
        for ct in engine.containers.list(all=True, filters={"label": labels})
        if owner.owns(ct.labels)
    ]


def wait(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


@dataclass
class TrainingFleet:
    server: LiveServer
    sims: list[PodmanHost]
    hosts: dict[int, PodmanHost] = field(default_factory=dict)  # added so far

    def add_host(self, c: httpx.Client, sim: PodmanHost, name: str, gpus: int) -> int:
        """Add ``sim`` through the API (location ``lab``) and wait for its heartbeat."""
        r = c.post(
            "/v1/hosts",
            json={"name": name, "engine_url": sim.ssh_url, "gpus": f"{A6000}:{gpus}",
                  "location": "lab", "vcpus": 16, "memory_gb": 32},
        )  # fmt: skip
        assert r.status_code == 201, r.text
        host_id = int(r.json()["data"]["id"])
        self.hosts[host_id] = sim

        def reachable() -> bool:
            shown = c.get(f"/v1/hosts/{host_id}").json()["data"]
            return bool(shown["reachability"] == "reachable")

        wait(reachable, 60, f"{name}'s first heartbeat")
        return host_id

    def api(self, host_id: int) -> Any:
        """The low-level engine client of ``host_id``, as the server reaches it."""
        runtime = self.server.server.reconciler.fleet.for_host(host_id)
        assert isinstance(runtime, DockerEngineRuntime)
        return runtime.engine.api

    def exec(self, host_id: int, container: str, argv: list[str]) -> tuple[int, str]:
        api = self.api(host_id)
        run = api.exec_create(container, argv)
        out = api.exec_start(run["Id"])
        code = int(api.exec_inspect(run["Id"]).get("ExitCode") or 0)
        return code, out.decode(errors="replace")

    def labelled(self, host_id: int, cid: int) -> set[str]:
        """Names of the containers of training cluster ``cid`` on ``host_id``."""
        rows = self.api(host_id).containers(all=True, filters={"label": f"{LABEL_TRAINING}={cid}"})
        return {row["Names"][0].lstrip("/") for row in rows}


@contextmanager
def training_fleet(
    home: Path,
    engine_url: str,
    sims: int,
    *,
    gpus: int = 2,
    added: int | None = None,
    load: tuple[str, ...] = (),
    volume_images: bool = True,
    **settings: Any,
) -> Iterator[TrainingFleet]:
    """The server and ``sims`` simulated hosts (``load``: images copied into each),
    the first ``added`` (all) added with ``gpus`` GPUs each. ``settings``: overrides."""
    try:
        build_slurm_image("podman", SLURM_IMAGE)
    except Exception as exc:  # no debootstrap / no mirror: say why
        pytest.fail(f"cannot build the Slurm node image: {exc}")
    keys = SshKeys(home)
    defaults: dict[str, Any] = {
        "local_gpus": "",
        "heartbeat_interval_s": 1.0,
        "training_ready_timeout_s": 300.0,
        "rate_limit_per_key": 0,
        "rate_limit_per_source": 0,
    }
    config = make_settings(home, **{**defaults, **settings})
    # The simulated hosts' storage is ext4: container disk sizes are not enforced there.
    policy = EnginePolicy(allow_unenforced_disk=True)
    made: list[PodmanHost] = []
    try:
        for _ in range(sims):  # one after the other: each takes the next free address
            sim = PodmanHost(ssh_key=keys.public_key())
            made.append(sim)
            sim.start()
            for image in load:
                sim.load_image(engine_url, image)
        local = DockerEngineRuntime(engine_url, policy=policy)
        factory = host_runtime_factory(
            home,
            policy,
            config.remote_engine_timeout_s,
            **({} if volume_images else {"volume_image_dir": None}),
        )
        operator = training_operator_factory(config, engine_url)
        with live_server(config, local, factory, operator) as server:
            try:
                fleet = TrainingFleet(server, made)
                with server.client() as c:
                    assert c.post("/v1/hosts/1/cordon").status_code == 200
                    for i, sim in enumerate(made[: sims if added is None else added]):
                        fleet.add_host(c, sim, f"sim-{i}", gpus)
                yield fleet
            finally:
                purge_installation(engine_url, server.server.ctx.ownership.installation_id)
    finally:
        for sim in made:
            sim.close()


def scope_of(c: httpx.Client) -> dict[str, Any]:
    """The query a seed 002 call needs: the first project, location ``lab``."""
    projects = c.get("/v1/projects").json()["data"]
    projects = projects if isinstance(projects, list) else projects["projects"]
    return {"project_id": projects[0]["id"], "location": "lab"}


def create_training(
    c: httpx.Client, params: dict[str, Any], name: str, workers: int, gpus_per_node: int
) -> int:
    """A training cluster on the Slurm node image, opened by :data:`SSH_KEY`; its id."""
    r = c.post("/v1/ssh-keys", json={"name": f"k-{name}", "public_key": SSH_KEY})
    if r.status_code == 201:
        key = r.json()["data"]
    else:  # the account has it already
        keys = c.get("/v1/ssh-keys").json()["data"]
        key = (keys if isinstance(keys, list) else keys["ssh_keys"])[0]
    images = c.get("/v1/images").json()["data"]
    images = images if isinstance(images, list) else images["images"]
    base = next(i for i in images if i["image"] == SLURM_IMAGE)
    created = c.post(
        BASE,
        params=params,
        json={"name": name, "image_version_id": base["id"], "ssh_key_ids": [key["id"]],
              "no_of_nodes": workers, "gpu_type": A6000, "gpus_per_node": gpus_per_node,
              "cpus_per_node": 1, "memory_gb_per_node": 1},
    )  # fmt: skip
    assert created.status_code == 201, created.text
    return int(created.json()["data"]["id"])


def detail(c: httpx.Client, cid: int, params: dict[str, Any]) -> dict[str, Any]:
    r = c.get(f"{BASE}{cid}/", params=params)
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()["data"]
    return data


def wait_running(c: httpx.Client, cid: int, params: dict[str, Any], timeout_s: float) -> None:
    def running() -> bool:
        data = detail(c, cid, params)
        assert data["status"] != "error", (data.get("error_message"), data.get("status_reason"))
        return bool(data["status"] == "running")

    wait(running, timeout_s, f"training cluster {cid} running")
