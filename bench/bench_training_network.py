"""The network between training nodes on different hosts: the VXLAN overlay vs the
hosts' own network, and ``srun`` across hosts vs on one host, in one run.

Set-up: two simulated hosts (tests/e2e/podman_host.py: each its own network namespace
behind a veth pair, its own Podman service and storage), the Slurm node image loaded
into both, and one training cluster driven through the same runtime the operator uses
(reconciler/training/cluster_nodes.py over runtimes/slurm/nodes.py, host commands run in each
host's namespace as they would over SSH): the controller and workers 1 and 3 on host A,
worker 2 on host B, one subnet, the overlay joining the two copies of the network.

- **TCP throughput:** ``--mib`` MiB (default 1024) of zeros from worker 1 (host A) to
  worker 2 (host B) over TCP (bash's /dev/tcp into a perl reader), timed by the sender;
  baseline: the very same commands between the two hosts' own addresses (host A's
  namespace to host B's). Goal: overlay >= 0.8x baseline.
- **srun launch latency:** ``srun -N2 -w worker-1,worker-2 true`` (across the hosts)
  vs ``srun -N2 -w worker-1,worker-3 true`` (both on host A), timed inside the
  controller. Goal: across <= 1.5x one host.

Rounds alternate and flip order each round; medians are compared. Needs root, podman,
perl, nft; cleans up its namespaces, services and storage.

    .venv/bin/python bench/bench_training_network.py [--rounds 5] [--mib 1024]
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import median
from tests.e2e.podman_host import PodmanHost, available

from gpuyard.core.ownership import Ownership
from gpuyard.core.training import network as training_network
from gpuyard.reconciler.training.cluster_nodes import ClusterNodes
from gpuyard.runtimes.engines.engine import Engine, EnginePolicy
from gpuyard.runtimes.engines.url import PodmanService
from gpuyard.runtimes.hosts.firewall import CommandResult, Runner
from gpuyard.runtimes.slurm import config as slurm_config
from gpuyard.runtimes.slurm.image import SLURM_IMAGE, build_slurm_image
from gpuyard.runtimes.slurm.nodes import NodeRole, NodeSpec, SlurmNodeRuntime

MIB = 1 << 20
PORT = 5201
READER = (
    'perl -MIO::Socket::INET -e \'$s=IO::Socket::INET->new(LocalAddr=>"{addr}",'
    "LocalPort=>{port},Listen=>1,ReuseAddr=>1) or die; $c=$s->accept; "
    "while(sysread($c,$b,1048576)){{}}'"
)
SENDER = (
    "s=$(date +%s%N); head -c {size} /dev/zero > /dev/tcp/{addr}/{port}; "
    "e=$(date +%s%N); echo $((e - s))"
)


def in_namespace(sim: PodmanHost) -> Runner:
    """Commands on the simulated host, as SshRunner runs them on a real one."""

    def run(argv: Sequence[str]) -> CommandResult:
        done = subprocess.run([*sim.nsenter(), *argv], capture_output=True, text=True, timeout=60)
        return CommandResult(done.returncode, done.stdout + done.stderr)

    return run


class Bench:
    def __init__(self, a: PodmanHost, b: PodmanHost) -> None:
        self.a, self.b = a, b
        owner = Ownership.new()
        policy = EnginePolicy(manage_host_firewall=True, allow_unenforced_disk=True)
        self.rt = {
            1: SlurmNodeRuntime(
                None,
                engine=Engine(a.url, 120, owner, policy=policy, firewall_runner=in_namespace(a)),
            ),
            2: SlurmNodeRuntime(
                None,
                engine=Engine(b.url, 120, owner, policy=policy, firewall_runner=in_namespace(b)),
            ),
        }
        prefix = f"gy-bench-{os.getpid()}"
        self.controller = f"{prefix}-controller"
        self.workers = [f"{prefix}-worker-{i}" for i in (1, 2, 3)]
        self.network, self.volume = f"{prefix}-net", f"{prefix}-slurmstate"
        self.subnet = "10.213.251.0/24"
        placement: dict[str, int | None] = {
            self.controller: 1, self.workers[0]: 1, self.workers[1]: 2, self.workers[2]: 1,
        }  # fmt: skip
        self.nodes = ClusterNodes(
            lambda h: self.rt[h or 1],
            placement,
            self.controller,
            self.subnet,
            {1: a.address, 2: b.address},
        )
        self.address = {self.controller: training_network.controller_address(self.subnet)}
        for i, w in enumerate(self.workers):
            self.address[w] = f"{self.subnet.rsplit('.', 1)[0]}.{10 + i}"

    def up(self) -> None:
        munge = base64.b64encode(secrets.token_bytes(1024))
        files = {
            "munge.key": (base64.b64decode(munge), 0o400),
            "slurm.conf": (
                slurm_config.slurm_conf("gy-bench", self.controller, 64).encode(),
                0o644,
            ),
            "authorized_keys": (b"", 0o600),
            "gres.conf": (slurm_config.gres_conf(0).encode(), 0o644),
        }
        self.nodes.ensure_network(self.network)
        for name in [self.controller, *self.workers]:
            role: NodeRole = "controller" if name == self.controller else "worker"
            spec = NodeSpec(
                name=name, role=role, image=SLURM_IMAGE, network=self.network, cpus=1,
                memory_gb=1, gpu_count=0, labels={"gpuyard.bench": str(os.getpid())},
                state_volume=self.volume if role == "controller" else None,
                address=self.address[name], hosts=self.address,
            )  # fmt: skip
            self.nodes.create_node(spec, files)
        for name in [self.controller, *self.workers]:
            self.nodes.set_hosts(name, self.address)
        self.nodes.wait_slurm_ready(self.controller, self.workers, 240)

    def down(self) -> None:
        for name in [self.controller, *self.workers]:
            self.nodes.remove_node(name)
        self.nodes.remove_network(self.network)
        self.nodes.remove_volume(self.volume)

    def overlay_rate(self, size: int) -> float:
        """MiB/s from worker 1 (host A) to worker 2 (host B), over the overlay."""
        reader = READER.format(addr="0.0.0.0", port=PORT)
        api = self.rt[2].engine.api
        run = api.exec_create(self.workers[1], ["sh", "-c", reader])
        api.exec_start(run["Id"], detach=True)
        time.sleep(0.5)
        code, out = self.nodes.exec(
            self.workers[0],
            ["bash", "-c", SENDER.format(size=size, addr=self.address[self.workers[1]], port=PORT)],
            110,
        )
        assert code == 0, out
        return size / MIB / (int(out.split()[-1]) / 1e9)

    def host_rate(self, size: int) -> float:
        """MiB/s from host A's namespace to host B's, between their own addresses."""
        reader = subprocess.Popen(
            [*self.b.nsenter(), "sh", "-c", READER.format(addr=self.b.address, port=PORT)]
        )
        try:
            time.sleep(0.5)
            out = subprocess.run(
                [*self.a.nsenter(), "bash", "-c", SENDER.format(size=size, addr=self.b.address, port=PORT)],
                capture_output=True, text=True, check=True, timeout=120,
            ).stdout  # fmt: skip
        finally:
            reader.wait(timeout=30)
        return size / MIB / (int(out.split()[-1]) / 1e9)

    def srun_s(self, workers: list[str]) -> float:
        script = f"s=$(date +%s%N); srun -N2 -w {','.join(workers)} true; e=$(date +%s%N); echo $((e - s))"
        code, out = self.nodes.exec(self.controller, ["bash", "-c", script], 60)
        assert code == 0, out
        return int(out.split()[-1]) / 1e9


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--mib", type=int, default=1024)
    args = parser.parse_args()
    problem = available()
    if problem:
        print(f"cannot run: {problem}")
        return 1
    build_slurm_image("podman", SLURM_IMAGE)
    workdir = Path(tempfile.mkdtemp(prefix="gy-bench-"))
    service = PodmanService(workdir / "podman.sock")  # this machine's engine, to copy from
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, workdir, True)
        stack.callback(service.stop)
        here = service.start()
        a = stack.enter_context(PodmanHost())
        b = stack.enter_context(PodmanHost())
        for sim in (a, b):
            sim.load_image(here, SLURM_IMAGE)
        bench = Bench(a, b)
        try:
            bench.up()
            size = args.mib * MIB
            overlay: list[float] = []
            host: list[float] = []
            across: list[float] = []
            one: list[float] = []
            w1, w2, w3 = bench.workers
            bench.overlay_rate(64 * MIB)  # warm-up (unmeasured)
            for r in range(args.rounds):
                order = (0, 1) if r % 2 == 0 else (1, 0)
                for which in order:
                    if which == 0:
                        overlay.append(bench.overlay_rate(size))
                        across.append(bench.srun_s([w1, w2]))
                    else:
                        host.append(bench.host_rate(size))
                        one.append(bench.srun_s([w1, w3]))
                print(
                    f"  round {r + 1}: overlay {overlay[-1]:7.0f} MiB/s  hosts {host[-1]:7.0f} MiB/s"
                    f"  srun across {across[-1] * 1000:6.0f} ms  one host {one[-1] * 1000:6.0f} ms"
                )
        finally:
            bench.down()
    rate = median(overlay) / median(host)
    launch = median(across) / median(one)
    print(f"\n{args.mib} MiB per transfer, {args.rounds} rounds, medians")
    print(f"TCP worker->worker across hosts (overlay) {median(overlay):8.0f} MiB/s")
    print(f"TCP host->host (the hosts' own addresses)  {median(host):8.0f} MiB/s")
    print(f"ratio overlay / hosts: {rate:.2f}x (goal >= 0.8x)")
    print(
        f"srun -N2 across hosts {median(across) * 1000:6.0f} ms, on one host {median(one) * 1000:6.0f} ms"
    )
    print(f"ratio across / one host: {launch:.2f}x (goal <= 1.5x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
