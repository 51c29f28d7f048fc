"""A fleet of three hosts reached over SSH, driven by the real server through its API:
placement across hosts, a host cut off and back, a stopped cluster resuming on another
host with its volume byte for byte, and a drain. Each host is simulated on this machine
(its own network namespace and address, Podman with its own storage, and sshd), so
every engine call crosses SSH and a veth. Root, podman and sshd needed."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpuyard.runtimes.engines.engine import Engine, EnginePolicy
from gpuyard.runtimes.engines.runtime import DockerEngineRuntime
from gpuyard.runtimes.hosts.runtimes import host_runtime_factory
from gpuyard.runtimes.hosts.ssh_tunnel import SshKeys
from gpuyard.runtimes.volumes.copy import volume_checksum
from tests.e2e.conftest import DEV_IMAGE
from tests.e2e.podman_host import HOSTS_HOW, PodmanHost, available
from tests.helpers import LiveServer, live_server, make_settings
from tests.required_parts import needs

pytestmark = needs("simulated hosts", available(), how=HOSTS_HOW)

A6000 = "NVIDIA RTX A6000"
# Writes a tree into the volume on its first start (a big random file, small files, a
# symlink, modes), then serves HTTP like the plain dev image.
SEED = (
    "sh -c '[ -e /workspace/tree/done ] || (mkdir -p /workspace/tree/sub && "
    "dd if=/dev/urandom of=/workspace/tree/big bs=1M count=8 2>/dev/null && "
    "seq 1 5000 > /workspace/tree/sub/numbers && ln -s numbers /workspace/tree/sub/link && "
    "chmod 0700 /workspace/tree/sub && touch /workspace/tree/done); "
    "exec /usr/local/bin/gpuyard-serve'"
)


class Fleet:
    def __init__(self, server: LiveServer, hosts: dict[int, PodmanHost]) -> None:
        self.server = server
        self.hosts = hosts  # host id -> simulated host

    def client(self) -> httpx.Client:
        return self.server.client()

    def engine(self, host_id: int) -> Engine:
        runtime = self.server.server.reconciler.fleet.for_host(host_id)
        assert isinstance(runtime, DockerEngineRuntime)
        return runtime.engine

    def volume(self, cluster_id: str) -> str:
        return self.server.server.ctx.ownership.volume(cluster_id)


def seeded_done(fleet: Fleet, host_id: int, cid: str) -> None:
    """Wait until SEED has written the whole tree (it runs before the container's
    server): a stop before that would leave a half-written volume to compare."""
    api = fleet.engine(host_id).api
    name = fleet.server.server.ctx.ownership.container(cid)

    def done() -> bool:
        run = api.exec_create(name, ["test", "-e", "/workspace/tree/done"])
        api.exec_start(run["Id"])
        return api.exec_inspect(run["Id"]).get("ExitCode") == 0

    wait(done, 60, f"{cid}'s seed written")


def wait(check: Callable[[], bool], timeout_s: float = 90.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.25)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, engine_url: str) -> Iterator[Fleet]:
    home = Path(tmp_path_factory.mktemp("fleet")) / "home"
    keys = SshKeys(home)
    settings = make_settings(
        home,
        local_gpus="",
        heartbeat_interval_s=1.0,
        heartbeat_misses=3,
        # Twelve starts at once share this machine's cores: an engine call may be slow.
        remote_engine_timeout_s=10.0,
        reconcile_interval_s=0.2,
        # The tests poll many clusters at once; no key of theirs is a noisy tenant.
        rate_limit_per_key=0,
        rate_limit_per_source=0,
    )
    # The simulated hosts' storage is on ext4: container disk sizes are not enforced
    # there (tests/e2e/test_disk_sizes_e2e.py tests the refusal).
    policy = EnginePolicy(allow_unenforced_disk=True)
    sims: list[PodmanHost] = []
    try:
        for _ in range(3):  # one after the other: each takes the next free address
            sim = PodmanHost(ssh_key=keys.public_key())
            sims.append(sim)
            sim.start()
            sim.load_image(engine_url, DEV_IMAGE)
        local = DockerEngineRuntime(engine_url, policy=policy)
        # No volume images: a dozen clusters with volumes would each hold one of this
        # machine's loop devices (its kernel caps them at max_loop=8, shared with every
        # other test run); test_disk_sizes_e2e.py tests sized volumes, and a sized
        # volume's move between hosts.
        factory = host_runtime_factory(
            home, policy, settings.remote_engine_timeout_s, volume_image_dir=None
        )
        with live_server(settings, local, factory) as server:
            hosts: dict[int, PodmanHost] = {}
            with server.client() as c:
                # Nothing lands on this machine: the fleet is the three hosts.
                assert c.post("/v1/hosts/1/cordon").status_code == 200
                for i, sim in enumerate(sims):
                    r = c.post(
                        "/v1/hosts",
                        json={"name": f"sim-{i}", "engine_url": sim.ssh_url,
                              "gpus": f"{A6000}:4", "location": "lab",
                              # More than this machine has: 12 clusters share its 2 cores.
                              "vcpus": 32, "memory_gb": 64},
                    )  # fmt: skip
                    assert r.status_code == 201, r.text
                    hosts[r.json()["data"]["id"]] = sim

                def all_reachable() -> bool:
                    listed = c.get("/v1/hosts").json()["data"]["hosts"]
                    return all(
                        h["reachability"] == "reachable" and h["engine_version"]
                        for h in listed
                        if h["id"] in hosts
                    )

                wait(all_reachable, 60, "the hosts' first heartbeats")
            yield Fleet(server, hosts)
    finally:
        for sim in sims:
            sim.close()


def create(c: httpx.Client, **body: Any) -> httpx.Response:
    payload = {"docker_image": DEV_IMAGE, "gpu_type": A6000, "gpu_count": 1,
               "cpu_cores": 1, "memory_gb": 1, "container_disk_gb": 1, "volume_gb": 0,
               "cloud_type": "ALL", **body}  # fmt: skip
    return c.post("/v1/clusters", json=payload)


def get_data(c: httpx.Client, path: str) -> dict[str, Any]:
    r = c.get(path)
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()["data"]
    return data


def cluster(c: httpx.Client, cid: str) -> dict[str, Any]:
    return get_data(c, f"/v1/clusters/{cid}")


def moved(c: httpx.Client, cid: str) -> bool:
    """Whether the cluster's volume has been copied to its new host: the event of the
    copy's end (its start is a "moved" event too, "moving volume from ...")."""
    events = get_data(c, f"/v1/clusters/{cid}/events")["events"]
    return any(
        e["type"] == "moved" and e["message"].startswith("volume moved from") for e in events
    )


def terminate_all(c: httpx.Client, ids: list[str]) -> None:
    for cid in ids:
        c.delete(f"/v1/clusters/{cid}")
    wait(lambda: all(cluster(c, cid)["status"] == "terminated" for cid in ids), 120, "terminate")


def test_concurrent_creates_take_exactly_the_fleets_gpus(fleet: Fleet) -> None:
    with fleet.client() as c, ThreadPoolExecutor(32) as pool:
        answers = list(pool.map(lambda _: create(c), range(32)))
        placed = [r.json()["data"] for r in answers if r.status_code in (200, 201)]
        refused = [r for r in answers if r.status_code == 409]
        assert len(placed) == 12 and len(refused) == 20, [
            r.text for r in answers if r.status_code not in (200, 201)
        ][:3]
        assert all(r.json()["error"]["code"] == "INSUFFICIENT_CAPACITY" for r in refused)
        per_host: dict[int, list[int]] = {}
        for p in placed:
            per_host.setdefault(p["host"]["id"], []).extend(p["gpu_indices"])
        assert sorted(per_host) == sorted(fleet.hosts)
        assert all(sorted(g) == [0, 1, 2, 3] for g in per_host.values())
        ids = [p["id"] for p in placed]
        wait(lambda: all(cluster(c, cid)["status"] == "running" for cid in ids), 120, "running")
        terminate_all(c, ids)


def test_a_host_cut_off_keeps_its_clusters_and_converges(fleet: Fleet) -> None:
    first = min(fleet.hosts)
    sim = fleet.hosts[first]
    with fleet.client() as c:
        held = create(c).json()["data"]  # binpack: the lowest host id of equals
        assert held["host"]["id"] == first
        wait(lambda: cluster(c, held["id"])["status"] == "running", what="running")
        sim.down()
        try:
            wait(
                lambda: c.get(f"/v1/hosts/{first}").json()["data"]["reachability"] == "unreachable",
                90,
                "the host to turn unreachable",
            )
            shown = cluster(c, held["id"])
            assert shown["status"] == "running" and shown["host_status"] == "unreachable"
            host = c.get(f"/v1/hosts/{first}").json()["data"]
            assert host["capacity"]["allocated"]["gpus"] == {A6000: 1}
            elsewhere = create(c).json()["data"]
            assert elsewhere["host"]["id"] != first
        finally:
            sim.up()
        wait(
            lambda: c.get(f"/v1/hosts/{first}").json()["data"]["reachability"] == "reachable",
            60,
            "the host to answer again",
        )
        wait(lambda: cluster(c, held["id"])["host_status"] == "reachable", 30, "host_status")
        assert cluster(c, held["id"])["status"] == "running"
        text = str(c.get(f"/v1/clusters/{held['id']}/events").json()["data"])
        assert "unreachable" in text and "answers again" in text
        terminate_all(c, [held["id"], elsewhere["id"]])


def test_a_stopped_cluster_resumes_on_another_host_with_its_volume(fleet: Fleet) -> None:
    first = min(fleet.hosts)
    with fleet.client() as c:
        seeded = create(c, gpu_count=4, volume_gb=1, docker_args=SEED).json()["data"]
        cid = seeded["id"]
        assert seeded["host"]["id"] == first
        wait(lambda: cluster(c, cid)["status"] == "running", what="running")
        seeded_done(fleet, first, cid)
        assert c.post(f"/v1/clusters/{cid}/stop").status_code == 200
        wait(lambda: cluster(c, cid)["status"] == "stopped", what="stopped")
        before = volume_checksum(fleet.engine(first), fleet.volume(cid))
        filler = create(c, gpu_count=4).json()["data"]
        assert filler["host"]["id"] == first  # the stopped cluster's host is now full

        r = c.post(f"/v1/clusters/{cid}/start", json={"allow_move": False})
        assert r.status_code == 409 and r.json()["error"]["code"] == "INSUFFICIENT_CAPACITY"
        assert cluster(c, cid)["status"] == "stopped" and cluster(c, cid)["host"]["id"] == first

        r = c.post(f"/v1/clusters/{cid}/start", json={})
        assert r.status_code == 200, r.text
        moved_to = r.json()["data"]["host"]["id"]
        assert moved_to != first
        wait(lambda: cluster(c, cid)["status"] == "running", what="running elsewhere")
        shown = cluster(c, cid)
        assert shown["id"] == cid and shown["host"]["id"] == moved_to
        assert fleet.hosts[moved_to].address in str(shown["network"])
        assert volume_checksum(fleet.engine(moved_to), fleet.volume(cid)) == before
        events = str(c.get(f"/v1/clusters/{cid}/events").json()["data"])
        assert "volume moved from host" in events and "bytes in" in events
        # The old copy goes once the cluster runs on its new host.
        old = fleet.engine(first)
        wait(
            lambda: fleet.volume(cid) not in [v.name for v in old.list_volumes()],
            30,
            "the old copy's removal",
        )
        terminate_all(c, [cid, filler["id"]])


def test_drain_moves_a_running_and_a_stopped_cluster_then_the_host_goes(fleet: Fleet) -> None:
    ids = sorted(fleet.hosts)
    last = ids[-1]
    with fleet.client() as c:
        for other in ids[:-1]:
            assert c.post(f"/v1/hosts/{other}/cordon").status_code == 200
        running = create(c, gpu_count=2, volume_gb=1, docker_args=SEED).json()["data"]["id"]
        resting = create(c, gpu_count=2, volume_gb=1, docker_args=SEED).json()["data"]["id"]
        for other in ids[:-1]:
            assert c.post(f"/v1/hosts/{other}/uncordon").status_code == 200
        assert {cluster(c, x)["host"]["id"] for x in (running, resting)} == {last}
        wait(lambda: all(cluster(c, x)["status"] == "running" for x in (running, resting)))
        for x in (running, resting):
            seeded_done(fleet, last, x)
        assert c.post(f"/v1/clusters/{resting}/stop").status_code == 200
        wait(lambda: cluster(c, resting)["status"] == "stopped", what="stopped")
        resting_sum = volume_checksum(fleet.engine(last), fleet.volume(resting))

        r = c.post(f"/v1/hosts/{last}/drain")
        assert r.status_code == 200, r.text
        assert r.json()["data"]["drain"]["stopping"] == [running]
        assert r.json()["data"]["drain"]["moving"] == [resting]
        wait(
            lambda: (
                cluster(c, running)["status"] == "running"
                and cluster(c, running)["host"]["id"] != last
            ),
            120,
            "the running cluster to run elsewhere",
        )
        # The drain names the new host at once; the data follows: wait for the copy.
        wait(lambda: cluster(c, resting)["host"]["id"] != last, 60, "the volume's new host")
        wait(lambda: moved(c, resting), 120, "the stopped cluster's volume copied")
        assert cluster(c, resting)["status"] == "stopped"
        new_home = cluster(c, resting)["host"]["id"]
        assert volume_checksum(fleet.engine(new_home), fleet.volume(resting)) == resting_sum
        # Nothing is left on the drained host: it can go.
        wait(lambda: c.delete(f"/v1/hosts/{last}").status_code == 200, 60, "the host delete")
        terminate_all(c, [running, resting])
