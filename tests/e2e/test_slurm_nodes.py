"""A real multi-node Slurm cluster in Podman containers, through SlurmNodeRuntime.

One cluster (network, controller with a state volume, two workers) is built for the
module; the tests run in file order on it and each leaves it healthy for the next:
srun across workers, a dynamic worker joining under a running job, worker and
controller restarts, SSH with installed keys, and finally the clean-up. The Slurm node
image is built once per session (about a minute, needs root, debootstrap and Debian's
mirror) and kept for later runs.

The runtime acts for an installation made for the module: its objects carry that id
(and names start with its prefix), and the fixture's safety-net clean-up removes only
objects labelled with it (the engine may be shared with a dev server).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import docker
import pytest

from gpuyard.core.ownership import Ownership
from gpuyard.core.training.clusters import LIFECYCLE_RC
from gpuyard.runtimes.engines.engine import EnginePolicy
from gpuyard.runtimes.slurm.config import gres_conf, slurm_conf
from gpuyard.runtimes.slurm.image import SLURM_IMAGE, build_slurm_image, derive_image
from gpuyard.runtimes.slurm.nodes import NodeSpec, SlurmNodeRuntime
from tests.e2e.conftest import purge_installation
from tests.required_parts import needs_tools

# Runtimes that keep the host firewall rules, as the server's do.
FIREWALL = EnginePolicy(manage_host_firewall=True)

# These tests drive real containers.
pytestmark = [
    pytest.mark.e2e,
    needs_tools("podman", how="apt-get install podman runc (bash scripts/setup-system.sh)"),
]

LABEL = "gpuyard.test.training_cluster"
READY_TIMEOUT_S = 60.0


@pytest.fixture(scope="session")
def slurm_image(engine_url: str) -> str:
    return build_slurm_image("podman", SLURM_IMAGE)


@dataclass
class Cluster:
    rt: SlurmNodeRuntime
    cid: str
    network: str
    volume: str
    controller: str
    workers: list[str]
    munge_key: bytes
    key_path: Path

    def files(self, gpus: int) -> dict[str, tuple[bytes, int]]:
        return {
            "munge.key": (self.munge_key, 0o400),
            "slurm.conf": (slurm_conf(self.cid, self.controller, 8).encode(), 0o644),
            "gres.conf": (gres_conf(gpus).encode(), 0o644),
            "authorized_keys": (Path(f"{self.key_path}.pub").read_bytes(), 0o600),
            "lifecycle.sh": (b"echo ran >> /root/lifecycle-runs\n", 0o755),
        }

    def worker_spec(self, name: str, gpu_indices: tuple[int, ...] = ()) -> NodeSpec:
        return NodeSpec(
            name=name,
            role="worker",
            image=SLURM_IMAGE,
            network=self.network,
            cpus=4,
            memory_gb=2,
            gpu_count=len(gpu_indices),
            gpu_indices=gpu_indices,
            labels={LABEL: self.cid},
        )

    def add_worker(self, name: str, gpu_indices: tuple[int, ...]) -> None:
        self.rt.create_node(self.worker_spec(name, gpu_indices), self.files(len(gpu_indices)))
        self.workers.append(name)

    def run(self, *argv: str, node: str | None = None) -> str:
        code, out = self.rt.exec(node or self.controller, list(argv))
        assert code == 0, f"{argv} exited {code}: {out}"
        return out


def keygen(path: Path) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path


def ssh(key: Path, address: str, command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            "ssh", "-i", str(key), "-o", "StrictHostKeyChecking=no",
            "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes",
            "-o", "ConnectTimeout=5", "-o", "LogLevel=ERROR", f"root@{address}", command,
        ],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip


def eventually(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.25)


def cleanup(c: Cluster) -> None:
    for name in c.rt.list_nodes(LABEL, c.cid):
        c.rt.remove_node(name)
    c.rt.remove_network(c.network)
    c.rt.remove_volume(c.volume)


@pytest.fixture(scope="module")
def cluster(
    engine_url: str, slurm_image: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    if shutil.which("ssh-keygen") is None or shutil.which("ssh") is None:
        pytest.fail("openssh-client is missing: run scripts/setup-system.sh")
    owner = Ownership.new()
    cid = f"{owner.prefix}-e2e-{uuid.uuid4().hex[:4]}"
    c = Cluster(
        rt=SlurmNodeRuntime(engine_url, owner=owner, policy=FIREWALL),
        cid=cid,
        network=f"{cid}-net",
        volume=f"{cid}-state",
        controller=f"{cid}-ctl",
        workers=[],
        munge_key=os.urandom(1024),
        key_path=keygen(tmp_path_factory.mktemp("ssh") / "id_ed25519"),
    )
    try:
        c.rt.ensure_network(c.network)
        c.rt.ensure_network(c.network)  # idempotent
        ctl = NodeSpec(
            name=c.controller,
            role="controller",
            image=slurm_image,
            network=c.network,
            cpus=1,
            memory_gb=1,
            gpu_count=0,
            labels={LABEL: cid},
            state_volume=c.volume,
        )
        c.rt.create_node(ctl, c.files(0))
        c.add_worker(f"{cid}-worker-1", (0, 1))
        c.add_worker(f"{cid}-worker-2", (2, 3))
        c.rt.wait_slurm_ready(c.controller, c.workers, READY_TIMEOUT_S)
        yield c
    finally:
        try:
            cleanup(c)
        finally:
            purge_installation(engine_url, owner.installation_id)


def test_srun_spans_both_workers(cluster: Cluster) -> None:
    out = cluster.run("srun", "-N2", "hostname")
    assert sorted(out.split()) == sorted(cluster.workers)
    # Two GPUs per worker as GRES, with no /dev/nvidia* on the host.
    gpus = cluster.run("srun", "-N1", "--gres=gpu:2", "sh", "-c", "echo $CUDA_VISIBLE_DEVICES")
    assert gpus.strip() == "0,1"
    env = cluster.run("env", node=cluster.workers[1])
    assert "NVIDIA_VISIBLE_DEVICES=2,3" in env
    assert "munge" not in env.lower()
    # The munge key is installed for munged only, and never logged.
    assert cluster.run("stat", "-c", "%a %U", "/etc/munge/munge.key").split() == ["400", "munge"]
    logs = docker.DockerClient(base_url=cluster.rt.base_url).api.logs(cluster.controller)
    assert cluster.munge_key not in logs
    assert cluster.run("cat", "/etc/gpuyard-image-version").strip() == "base"
    # The controller has a fixed address, pinned on workers so Slurm needs no DNS.
    ctl_ip = cluster.rt.node_address(cluster.controller, cluster.network)
    assert ctl_ip is not None and ctl_ip.endswith(".254")
    pinned = cluster.run("getent", "hosts", cluster.controller, node=cluster.workers[0])
    assert pinned.split()[0] == ctl_ip


def test_dynamic_worker_joins_under_a_running_job(cluster: Cluster) -> None:
    job = cluster.run("sbatch", "-N2", "--parsable", "--wrap", "sleep 600").strip()

    def state() -> str:
        return cluster.run("squeue", "-h", "-j", job, "-o", "%T").strip()

    eventually(lambda: state() == "RUNNING", 20, "the batch job to run")
    new = f"{cluster.cid}-worker-3"
    cluster.add_worker(new, (4, 5))
    cluster.rt.wait_slurm_ready(cluster.controller, cluster.workers, READY_TIMEOUT_S)
    assert dict(cluster.rt.sinfo(cluster.controller))[new] == "idle"
    assert state() == "RUNNING"
    assert cluster.run("srun", "-w", new, "hostname").strip() == new
    cluster.run("scancel", job)


def _start_ticks(c: Cluster, node: str, pid: int) -> str:
    # PIDs can repeat in a fresh PID namespace; the start time (ticks since host boot)
    # tells a new process from the old one.
    return c.run("sh", "-c", f"cut -d' ' -f22 /proc/{pid}/stat", node=node).strip()


def test_worker_restart_keeps_controller(cluster: Cluster) -> None:
    rt = cluster.rt
    ctl_pid = rt.slurm_pid(cluster.controller, "slurmctld")
    assert ctl_pid is not None
    before: dict[str, tuple[int, str]] = {}
    for w in cluster.workers:
        pid = rt.slurm_pid(w, "slurmd")
        assert pid is not None
        before[w] = (pid, _start_ticks(cluster, w, pid))
    for w in cluster.workers:
        rt.restart_node(w)
    for w in cluster.workers:

        def restarted(w: str = w) -> bool:
            pid = rt.slurm_pid(w, "slurmd")
            return pid is not None and (pid, _start_ticks(cluster, w, pid)) != before[w]

        # The entrypoint starts slurmd a moment after the container starts.
        eventually(restarted, 20, f"a new slurmd on {w}")
    assert rt.slurm_pid(cluster.controller, "slurmctld") == ctl_pid
    rt.wait_slurm_ready(cluster.controller, cluster.workers, READY_TIMEOUT_S)
    # Podman gives a restarted container a new IP; the controller must use the new one.
    # (The entrypoint tells it with retries: a loaded machine may take a while.)
    for w in cluster.workers:

        def readdressed(w: str = w) -> bool:
            shown = cluster.run("scontrol", "show", "node", w)
            return f"NodeAddr={rt.node_address(w, cluster.network)} " in shown

        eventually(readdressed, 30, f"the controller using {w}'s new address")
    out = cluster.run("srun", f"-N{len(cluster.workers)}", "hostname")
    assert sorted(out.split()) == sorted(cluster.workers)
    # lifecycle.sh ran once per container, not again on restart.
    runs = cluster.run("cat", "/root/lifecycle-runs", node=cluster.workers[0])
    assert runs.split() == ["ran"]


def test_controller_restart_keeps_queued_jobs(cluster: Cluster) -> None:
    job = cluster.run("sbatch", "--hold", "--parsable", "--wrap", "hostname").strip()
    address = cluster.rt.node_address(cluster.controller, cluster.network)
    cluster.rt.restart_node(cluster.controller)
    assert cluster.rt.node_address(cluster.controller, cluster.network) == address

    def queued() -> str:
        code, out = cluster.rt.exec(cluster.controller, ["squeue", "-h", "-j", job, "-o", "%T %r"])
        return out.strip() if code == 0 else ""

    eventually(lambda: queued() != "", 30, "slurmctld to answer after its restart")
    assert queued().startswith("PENDING")
    cluster.rt.wait_slurm_ready(cluster.controller, cluster.workers, READY_TIMEOUT_S)
    cluster.run("scontrol", "release", job)

    def done() -> bool:
        out = cluster.run("scontrol", "show", "job", job)
        return "JobState=COMPLETED" in out

    eventually(done, 30, "the released job to complete")
    out = cluster.run("srun", f"-N{len(cluster.workers)}", "hostname")
    assert sorted(out.split()) == sorted(cluster.workers)


def test_ssh_with_installed_keys(cluster: Cluster, tmp_path: Path) -> None:
    rt = cluster.rt
    address = rt.node_address(cluster.controller, cluster.network)
    assert address
    first = ssh(cluster.key_path, address, "hostname")
    assert (first.returncode, first.stdout.strip()) == (0, cluster.controller), first.stderr
    new_key = keygen(tmp_path / "id_new")
    rt.install_authorized_keys(cluster.controller, Path(f"{new_key}.pub").read_text())
    mode = cluster.run("stat", "-c", "%a %U", "/root/.ssh/authorized_keys")
    assert mode.split() == ["600", "root"]
    ok = ssh(new_key, address, "sinfo -h -o %D")
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip() == str(len(cluster.workers))
    assert ssh(cluster.key_path, address, "true").returncode != 0  # old key replaced


def test_derived_image_carries_marker(cluster: Cluster) -> None:
    name = f"localhost/gpuyard/{cluster.cid}:v2"
    derive_image(SLURM_IMAGE, name, "v2", runtime_cli="podman")
    client = docker.DockerClient(base_url=cluster.rt.base_url)
    try:
        # Detached, then waited for: Podman 4.3's attach can miss the end of a container
        # that exits at once, and a streaming run() then hangs.
        probe = client.containers.run(name, ["cat", "/etc/gpuyard-image-version"], detach=True)
        try:
            probe.wait(timeout=60)
            out = probe.logs(stdout=True, stderr=False)
        finally:
            probe.remove(force=True)
        assert out.decode().strip() == "v2"
        config = client.api.inspect_image(name)["Config"]
        assert config["Cmd"] == ["/usr/local/bin/gpuyard-node"]
    finally:
        client.api.remove_image(name, force=True)


def test_lifecycle_result_and_a_restart_cutting_it_short(cluster: Cluster) -> None:
    rt = cluster.rt
    eventually(lambda: rt.lifecycle_result(cluster.workers[0]) == 0, 20, "exit code 0")
    name = f"{cluster.cid}-slow"
    slow_script = {"lifecycle.sh": (b"sleep 300\n", 0o755)}
    rt.create_node(cluster.worker_spec(name), {**cluster.files(0), **slow_script})
    try:
        # The script has begun (its marker is written just before it starts).
        marker = f"{LIFECYCLE_RC}.started"
        eventually(lambda: rt.exec(name, ["test", "-e", marker])[0] == 0, 20, "script begun")
        assert rt.lifecycle_result(name) is None
        rt.restart_node(name)
        # Not run again, and not waited for in vain: it reads as failed, with the code
        # of the signal that ended it (143 written by the entrypoint when the script's
        # shell died before it could write one itself).
        codes: list[int | None] = []

        def finished() -> bool:
            codes.append(rt.lifecycle_result(name))
            return codes[-1] is not None

        eventually(finished, 30, "the interrupted script's exit code")
        assert codes[-1] in (137, 143), codes
        assert "sleep 300" not in cluster.run("ps", "-eo", "args", node=name)
    finally:
        rt.remove_node(name)
        rt.delete_slurm_node(cluster.controller, name)


def test_cleanup_removes_everything(cluster: Cluster) -> None:
    rt = cluster.rt
    for name in list(cluster.workers):
        rt.remove_node(name)
        rt.delete_slurm_node(cluster.controller, name)
        rt.delete_slurm_node(cluster.controller, name)  # idempotent
        assert rt.node_state(name) == "missing"
    assert rt.sinfo(cluster.controller) == []
    cleanup(cluster)
    cleanup(cluster)  # idempotent
    assert rt.list_nodes(LABEL, cluster.cid) == []
    assert rt.node_state(cluster.controller) == "missing"
    client = docker.DockerClient(base_url=rt.base_url)
    with pytest.raises(docker.errors.NotFound):
        client.api.inspect_network(cluster.network)
    with pytest.raises(docker.errors.NotFound):
        client.api.inspect_volume(cluster.volume)
