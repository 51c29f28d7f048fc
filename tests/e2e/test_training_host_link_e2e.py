"""A training cluster's host loses its link and gets it back: the real server, real
Slurm nodes on one simulated host reached over SSH (its own network namespace and
Podman, tests/e2e/podman_host.py). While the link is down the nodes show
``host_status: "unreachable"`` and bill nothing from the host's last answered
heartbeat; once it answers they show ``reachable`` and bill from then on, and the
cluster still runs. Root, podman and sshd needed; builds the Slurm node image when
this machine's engine lacks it."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from gpuyard.api.app import training_operator_factory
from gpuyard.core.training import node_owner
from gpuyard.runtimes.docker_engine import DockerEngineRuntime
from gpuyard.runtimes.engine import EnginePolicy
from gpuyard.runtimes.host_runtimes import host_runtime_factory
from gpuyard.runtimes.slurm_image import SLURM_IMAGE, build_slurm_image
from gpuyard.runtimes.ssh_tunnel import SshKeys
from gpuyard.store.schema import Host, UsageInterval
from tests.e2e.conftest import purge_installation
from tests.e2e.podman_host import PodmanHost, available
from tests.helpers import LiveServer, live_server, make_settings

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(available() is not None, reason=str(available()))]

A6000 = "NVIDIA RTX A6000"
BASE = "/distributed_jobs_v2/cluster/"
SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGe4tciPtcKsqalQ5MYQNCKBAGbS1rO94qvBwyD7hpHy k1"


def wait(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


@pytest.fixture(scope="module")
def remote(
    tmp_path_factory: pytest.TempPathFactory, engine_url: str
) -> Iterator[tuple[LiveServer, int, PodmanHost]]:
    try:
        build_slurm_image("podman", SLURM_IMAGE)
    except Exception as exc:  # no debootstrap / no mirror: say why
        pytest.fail(f"cannot build the Slurm node image: {exc}")
    home = Path(tmp_path_factory.mktemp("training-link")) / "home"
    keys = SshKeys(home)
    settings = make_settings(
        home,
        local_gpus="",
        heartbeat_interval_s=1.0,
        heartbeat_misses=3,
        # A cut link answers nothing: each heartbeat gives up after this long.
        remote_engine_timeout_s=5.0,
        training_ready_timeout_s=240.0,
        rate_limit_per_key=0,
        rate_limit_per_source=0,
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
                    assert c.post("/v1/hosts/1/cordon").status_code == 200
                    r = c.post(
                        "/v1/hosts",
                        json={"name": "sim", "engine_url": sim.ssh_url, "gpus": f"{A6000}:2",
                              "location": "lab", "vcpus": 16, "memory_gb": 32},
                    )  # fmt: skip
                    assert r.status_code == 201, r.text
                    host_id = r.json()["data"]["id"]

                    def reachable() -> bool:
                        shown = c.get(f"/v1/hosts/{host_id}").json()["data"]
                        return bool(shown["reachability"] == "reachable")

                    wait(reachable, 60, "the host's first heartbeat")
                yield server, host_id, sim
            finally:
                purge_installation(engine_url, server.server.ctx.ownership.installation_id)
    finally:
        sim.close()


def detail(c: httpx.Client, cid: int, params: dict[str, Any]) -> dict[str, Any]:
    r = c.get(f"{BASE}{cid}/", params=params)
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()["data"]
    return data


def intervals(server: LiveServer, holder: str) -> list[tuple[datetime, datetime | None]]:
    with server.server.ctx.read() as s:
        return [
            (r.started_at, r.ended_at)
            for r in s.execute(
                select(UsageInterval.started_at, UsageInterval.ended_at)
                .where(UsageInterval.cluster_id == holder)
                .order_by(UsageInterval.id)
            )
        ]


def test_nodes_on_a_cut_off_host_show_it_and_bill_nothing_until_it_answers(
    remote: tuple[LiveServer, int, PodmanHost],
) -> None:
    server, host_id, sim = remote
    with server.client() as c:
        projects = c.get("/v1/projects").json()["data"]
        projects = projects if isinstance(projects, list) else projects["projects"]
        params = {"project_id": projects[0]["id"], "location": "lab"}
        key = c.post("/v1/ssh-keys", json={"name": "k", "public_key": SSH_KEY}).json()["data"]
        images = c.get("/v1/images").json()["data"]
        images = images if isinstance(images, list) else images["images"]
        base = next(i for i in images if i["image"] == SLURM_IMAGE)
        created = c.post(
            BASE,
            params=params,
            json={"name": "cut", "image_version_id": base["id"], "ssh_key_ids": [key["id"]],
                  "no_of_nodes": 1, "gpu_type": A6000, "gpus_per_node": 1,
                  "cpus_per_node": 1, "memory_gb_per_node": 1},
        )  # fmt: skip
        assert created.status_code == 201, created.text
        cid = created.json()["data"]["id"]

        def running() -> bool:
            data = detail(c, cid, params)
            assert data["status"] != "error", data
            return bool(data["status"] == "running")

        wait(running, 600, "the cluster running")
        [worker] = [n for n in detail(c, cid, params)["nodes"] if n["role"] == "worker"]
        holder = node_owner(worker["id"])
        assert worker["host_id"] == host_id and worker["host_status"] == "reachable"
        assert {end for _, end in intervals(server, holder)} == {None}  # billing

        sim.down()
        try:

            def cut_off() -> bool:
                nodes = detail(c, cid, params)["nodes"]
                return all(n["host_status"] == "unreachable" for n in nodes)

            wait(cut_off, 120, "the nodes to show their host unreachable")
            with server.server.ctx.read() as s:
                host = s.get(Host, host_id)
                assert host is not None and host.last_heartbeat_at is not None
                last_answer = host.last_heartbeat_at.replace(microsecond=0)
            # Nothing billed from the last answered heartbeat on.
            assert {end for _, end in intervals(server, holder)} == {last_answer}
            assert detail(c, cid, params)["status"] == "running"
        finally:
            sim.up()
        cut_until = datetime.now(UTC).replace(tzinfo=None, microsecond=0)

        def back() -> bool:
            nodes = detail(c, cid, params)["nodes"]
            return all(n["host_status"] == "reachable" for n in nodes)

        wait(back, 120, "the nodes to show their host reachable again")
        # Billed again from the host's first answer, not before the link came back.
        reopened = [start for start, end in intervals(server, holder) if end is None]
        assert reopened and all(start.replace(tzinfo=None) >= cut_until for start in reopened)
        events = c.get(f"{BASE}{cid}/events/", params=params)
        assert events.status_code == 200, events.text
        text = str(events.json()["data"])
        assert "unreachable" in text and "answers again" in text
        assert detail(c, cid, params)["status"] == "running"

        assert c.delete(f"{BASE}{cid}/", params=params).status_code in (200, 202, 204)
        wait(lambda: detail_gone(c, cid, params), 180, "the cluster deleted")


def detail_gone(c: httpx.Client, cid: int, params: dict[str, Any]) -> bool:
    return c.get(f"{BASE}{cid}/", params=params).status_code == 404
