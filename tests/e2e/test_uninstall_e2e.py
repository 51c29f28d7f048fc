"""``gpuyard uninstall`` against a real server's leftovers on two hosts reached over SSH
(each simulated on this machine: its own network namespace, Podman and sshd): a cluster
with a volume on one, one with a private http port on the other (so account networks
and the isolation chain exist on both). After the server stops, ``uninstall`` leaves
nothing labelled with the installation and none of its chains on either host, keeps the
volumes unless ``--delete-volumes``, and never touches a second installation's
container, network and chain on the same engine. Root, podman and sshd needed."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import pytest
from click.testing import CliRunner, Result

from gpuyard.cli.main import cli
from gpuyard.core.ownership import LABEL_INSTALLATION, Ownership
from gpuyard.runtimes.engines.engine import EnginePolicy
from gpuyard.runtimes.engines.runtime import DockerEngineRuntime
from gpuyard.runtimes.hosts.firewall import CommandResult, IptablesIsolation, chain_name
from gpuyard.runtimes.hosts.runtimes import host_runtime_factory
from gpuyard.runtimes.hosts.ssh_tunnel import SshKeys
from gpuyard.settings import Settings
from gpuyard.testing.fake_runtime import FakeRuntime
from tests.e2e.conftest import DEV_IMAGE
from tests.e2e.podman_host import HOSTS_HOW, PodmanHost, available
from tests.helpers import live_server, make_settings
from tests.required_parts import needs

pytestmark = needs("simulated hosts", available(), how=HOSTS_HOW)

A6000 = "NVIDIA RTX A6000"


def wait(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.25)


def in_host(sim: PodmanHost) -> Callable[[Sequence[str]], CommandResult]:
    """A command runner inside the simulated host's network namespace (its firewall)."""

    def run(argv: Sequence[str]) -> CommandResult:
        done = subprocess.run([*sim.nsenter(), *argv], capture_output=True, text=True, timeout=30)
        return CommandResult(done.returncode, (done.stdout + done.stderr).strip())

    return run


def firewall(sim: PodmanHost) -> str:
    """The host's whole iptables state (every table)."""
    return in_host(sim)(["iptables-save"]).output


@dataclass
class Leftovers:
    settings: Settings
    sims: list[PodmanHost]
    owner: Ownership
    other: Ownership
    engine_url: str

    def client(self, sim: PodmanHost) -> docker.DockerClient:
        return docker.DockerClient(base_url=f"unix://{sim.socket}")

    def labelled(self, sim: PodmanHost, installation: str) -> dict[str, list[str]]:
        wanted = {"label": f"{LABEL_INSTALLATION}={installation}"}
        c = self.client(sim)
        try:
            return {
                "containers": [x.name for x in c.containers.list(all=True, filters=wanted)],
                "networks": [n.name for n in c.networks.list(filters=wanted)],
                "volumes": [v.name for v in c.volumes.list(filters=wanted)],
            }
        finally:
            c.close()

    def uninstall(self, *args: str, answer: str | None = None) -> Result:
        env = {
            "GPUYARD_HOME": str(self.settings.home),
            "GPUYARD_PORT": str(self.settings.port),
            "GPUYARD_ENGINE_URL": self.engine_url,
            "GPUYARD_REMOTE_ENGINE_TIMEOUT_S": "10",
        }
        return CliRunner().invoke(cli, ["uninstall", *args], env=env, input=answer)


@pytest.fixture(scope="module")
def leftovers(tmp_path_factory: pytest.TempPathFactory, engine_url: str) -> Iterator[Leftovers]:
    home = Path(tmp_path_factory.mktemp("uninstall")) / "home"
    keys = SshKeys(home)
    settings = make_settings(
        home, local_gpus="", heartbeat_interval_s=1.0, remote_engine_timeout_s=10.0,
        reconcile_interval_s=0.2, rate_limit_per_key=0, rate_limit_per_source=0,
    )  # fmt: skip
    policy = EnginePolicy(allow_unenforced_disk=True)
    sims: list[PodmanHost] = []
    other = Ownership.new()
    try:
        for _ in range(2):
            sim = PodmanHost(ssh_key=keys.public_key())
            sims.append(sim)
            sim.start()
            sim.load_image(engine_url, DEV_IMAGE)
        local = DockerEngineRuntime(engine_url, policy=policy)
        factory = host_runtime_factory(home, policy, 10.0, volume_image_dir=None)
        with live_server(settings, local, factory) as server:
            owner = server.server.ctx.ownership
            with server.client() as c:
                assert c.post("/v1/hosts/1/cordon").status_code == 200
                ids = []
                for i, sim in enumerate(sims):
                    r = c.post("/v1/hosts", json={
                        "name": f"un-{i}", "engine_url": sim.ssh_url, "gpus": f"{A6000}:1",
                        "location": "lab", "vcpus": 8, "memory_gb": 16,
                    })  # fmt: skip
                    assert r.status_code == 201, r.text
                    ids.append(r.json()["data"]["id"])

                def reachable() -> bool:
                    listed = c.get("/v1/hosts").json()["data"]["hosts"]
                    return all(
                        h["reachability"] == "reachable" and h["engine_version"]
                        for h in listed
                        if h["id"] in ids
                    )

                wait(reachable, 60, "the hosts' first heartbeats")
                base = {"docker_image": DEV_IMAGE, "gpu_type": A6000, "gpu_count": 1,
                        "cpu_cores": 1, "memory_gb": 1, "container_disk_gb": 1,
                        "cloud_type": "ALL"}  # fmt: skip
                clusters = []
                # One GPU per host: the two clusters land on different hosts.
                for body in (
                    {"name": "with-volume", "volume_gb": 1},
                    {"name": "private-http", "volume_gb": 0,
                     "ports": [{"internal_port": 8888, "protocol": "http"}]},
                ):  # fmt: skip
                    r = c.post("/v1/clusters", json={**base, **body})
                    assert r.status_code in (200, 201), r.text
                    clusters.append(r.json()["data"]["id"])

                def running() -> bool:
                    rows = [c.get(f"/v1/clusters/{cid}").json()["data"] for cid in clusters]
                    return all(row["status"] == "running" for row in rows)

                wait(running, 120, "both clusters running")
        # A second installation on the first host: a container, a network and a chain.
        c0 = docker.DockerClient(base_url=f"unix://{sims[0].socket}")
        try:
            c0.networks.create(f"{other.prefix}-net-a1", labels=other.labels())
            c0.containers.create(DEV_IMAGE, name=f"{other.prefix}-keep", labels=other.labels())
        finally:
            c0.close()
        theirs = IptablesIsolation(other.short, runner=in_host(sims[0]), iptables="iptables")
        theirs.protect(["gy000000000000"])
        yield Leftovers(settings, sims, owner, other, engine_url)
    finally:
        for sim in sims:
            sim.close()


def test_uninstall_keeps_volumes_then_deletes_them_and_spares_the_other_installation(
    leftovers: Leftovers,
) -> None:
    ours, sims = leftovers.owner, leftovers.sims
    before = [leftovers.labelled(sim, ours.installation_id) for sim in sims]
    assert sum(len(b["containers"]) for b in before) == 2
    assert any(b["volumes"] for b in before) and all(b["networks"] for b in before)
    assert all(chain_name(ours.short) in firewall(sim) for sim in sims)

    kept = leftovers.uninstall("--json")
    assert kept.exit_code == 0, kept.output
    report: dict[str, Any] = json.loads(kept.stdout)
    assert report["installation_id"] == ours.installation_id
    by_host = {h["host"]: h for h in report["hosts"]}
    assert {"local", "un-0", "un-1"} <= set(by_host)
    assert all(h["error"] is None for h in by_host.values())
    assert sum(len(h["containers"]) for h in by_host.values()) == 2
    assert sum(len(h["volumes_kept"]) for h in by_host.values()) >= 1
    assert all(not h["volumes"] for h in by_host.values())
    for sim in sims:
        left = leftovers.labelled(sim, ours.installation_id)
        assert left["containers"] == [] and left["networks"] == []
        assert ours.short not in firewall(sim)
    assert any(leftovers.labelled(sim, ours.installation_id)["volumes"] for sim in sims)
    assert leftovers.settings.home.exists()

    # Without --yes the volumes are listed and nothing is deleted on "no".
    asked = leftovers.uninstall("--delete-volumes", answer="n\n")
    assert asked.exit_code == 1 and "VOLUME" in asked.stdout
    assert any(leftovers.labelled(sim, ours.installation_id)["volumes"] for sim in sims)

    gone = leftovers.uninstall("--delete-volumes", "--yes")
    assert gone.exit_code == 0, gone.output
    assert "volumes deleted (1)" in gone.stdout
    for sim in sims:
        assert leftovers.labelled(sim, ours.installation_id) == {
            "containers": [], "networks": [], "volumes": []
        }  # fmt: skip
    # The other installation on the same engine: untouched.
    theirs = leftovers.labelled(sims[0], leftovers.other.installation_id)
    assert theirs["containers"] == [f"{leftovers.other.prefix}-keep"]
    assert theirs["networks"] == [f"{leftovers.other.prefix}-net-a1"]
    assert chain_name(leftovers.other.short) in firewall(sims[0])


def test_refuses_while_a_server_answers_and_reports_a_dead_host(
    leftovers: Leftovers, tmp_path: Path
) -> None:
    # Some server answers at this home's address (its own home: nothing of ours is
    # touched): uninstall refuses.
    elsewhere = make_settings(tmp_path / "elsewhere", port=leftovers.settings.port)
    with live_server(elsewhere, FakeRuntime()):
        refused = leftovers.uninstall()
    assert refused.exit_code == 1 and "stop it first" in refused.output
    leftovers.sims[1].down()
    try:
        result = leftovers.uninstall("--purge-home")
    finally:
        leftovers.sims[1].up()
    assert result.exit_code == 1
    assert "error: host un-1:" in result.stderr
    assert leftovers.settings.home.exists()
