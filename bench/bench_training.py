"""Training clusters (Slurm): gpuyard's API vs driving the engine by hand, same run.

Set-up: a private ``podman system service`` on a temp socket (PodmanService), the Slurm
node image (build_slurm_image: a no-op when it exists) and the real server as a
subprocess (``python -m gpuyard serve``, GPUYARD_HOME temp, GPUYARD_ENGINE_URL = that
socket, 8x A6000 declared with GPUYARD_LOCAL_GPUS, SSH ports from 46000, reserved IPs
from 127.0.46.0/29, training SSH bound to 127.0.0.1). One SSH key is registered; every
cluster has a controller and 2 workers of 1 GPU, 1 vCPU and 1 GB each.

Per round (default 5, ``--rounds``), gpuyard and the baseline alternate, the order
flipping every round:

1. create -> ready. gpuyard: ``POST /distributed_jobs_v2/cluster/`` until ``GET`` says
   ``running`` (the operator has seen every worker idle in Slurm), polled every 100 ms.
   Baseline: the same three containers through SlurmNodeRuntime on the same engine:
   ensure_network, create_node controller (state volume) then the workers, with the
   files the operator gives (munge key, slurm.conf, gres.conf, authorized_keys), then
   wait_slurm_ready. The ratio is the control plane's overhead over the same calls.
2. scale +1 -> new node idle. gpuyard: ``PUT {"action": "scale_cluster",
   "additional_nodes": 1}`` until ``GET`` says ``running`` again. Baseline: create_node
   one more worker, then wait_slurm_ready for all three.
3. ``srun -N2 hostname`` round trip on the gpuyard cluster (``--srun-reps`` per round,
   the three paths rotated): ``ssh -p PORT root@127.0.0.1`` through the host's DNAT
   rules (runtimes/hosts/edge.py; port from the cluster's ``ssh`` block), ``ssh``
   straight to the controller container's address, and ``podman exec CONTROLLER srun``.

Then both clusters are removed (not in the ratios; shown for reference): gpuyard
``DELETE`` until ``GET`` answers 404; baseline remove_node for every node, then the
network and the state volume.

Sharing the engine with a concurrent e2e run: the baseline's names start with
``gy-bench-<pid>-`` and its nodes carry the bench server's installation id; gpuyard
names nodes ``gy<installation>-tc<cluster id>-...``, so nothing collides with another
run. A deleted placeholder row (id 46000) is still written into the store first, so
this server's clusters are 46001 and up. A round whose containers vanish anyway (Slurm
readiness is bounded at 90 s on both sides) is discarded, cleaned up and run again,
at most 3 times, saying so.

    .venv/bin/python bench/bench_training.py [--rounds 5] [--srun-reps 5]
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import docker
import httpx
from sqlalchemy import select

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import free_port, installation_label, median, start_server, stop_process, tail

from gpuyard.core.errors import GpuyardError
from gpuyard.core.ownership import Ownership
from gpuyard.core.training.clusters import NodeName, TrainingStatus
from gpuyard.runtimes.engines.engine import EnginePolicy
from gpuyard.runtimes.engines.url import PodmanService
from gpuyard.runtimes.hosts.edge import IptablesEdge
from gpuyard.runtimes.slurm.config import gres_conf, slurm_conf
from gpuyard.runtimes.slurm.image import SLURM_IMAGE, build_slurm_image
from gpuyard.runtimes.slurm.nodes import NodeSpec, SlurmNodeRuntime
from gpuyard.services.installation.bootstrap import open_store
from gpuyard.settings import Settings
from gpuyard.store.schema import Project, TrainingCluster

BASE = "/distributed_jobs_v2/cluster/"
GPU = "NVIDIA RTX A6000"
POLL_S = 0.1
READY_TIMEOUT_S = 90.0
PLACEHOLDER_ID = 46000
PORT_RANGE = (46000, 46999)
RESERVED_IPS = "127.0.46.0/29"
# sinfo states of a node that takes work (drained ones are up but take none).
USABLE = frozenset({"idle", "mixed", "allocated", "mix", "alloc"})
WORKER_CPUS = 1
WORKER_MEMORY_GB = 1
LABEL_BENCH = "gpuyard.bench"
MAX_ATTEMPTS = 3
RESULT_KEYS = ("gy_create", "bare_create", "gy_scale", "bare_scale", "gy_delete", "bare_remove",
               "srun_fwd", "srun_direct", "srun_exec")  # fmt: skip

# ------------------------------------------------------------------ gpuyard (API)


class Gpuyard:
    """The training API of the real server, as a client drives it."""

    def __init__(
        self, c: httpx.Client, params: dict[str, Any], image_id: int, key_id: int, live: set[int]
    ) -> None:
        self.c, self.params, self.image_id, self.key_id = c, params, image_id, key_id
        self.live = live  # ids created and not yet confirmed deleted

    def get(self, cid: int) -> httpx.Response:
        return self.c.get(f"{BASE}{cid}/", params=self.params)

    def wait_running(self, cid: int, timeout_s: float = READY_TIMEOUT_S + 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            data: dict[str, Any] = self.get(cid).json()["data"]
            if data["status"] == TrainingStatus.RUNNING:
                return data
            if data["status"] == TrainingStatus.ERROR:
                raise RuntimeError(f"cluster {cid}: {data.get('error_message')}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"cluster {cid} stuck in {data['status']}: {data}")
            time.sleep(POLL_S)

    def create(self, name: str) -> tuple[int, float, dict[str, Any]]:
        body = {"name": name, "image_version_id": self.image_id, "ssh_key_ids": [self.key_id],
                "no_of_nodes": 2, "gpu_type": GPU, "gpus_per_node": 1,
                "cpus_per_node": WORKER_CPUS, "memory_gb_per_node": WORKER_MEMORY_GB}  # fmt: skip
        t0 = time.perf_counter()
        r = self.c.post(BASE, params=self.params, json=body)
        if r.status_code != 201:
            raise RuntimeError(f"create failed: {r.status_code} {r.text}")
        cid: int = r.json()["data"]["id"]
        self.live.add(cid)
        data = self.wait_running(cid)
        return cid, time.perf_counter() - t0, data

    def scale(self, cid: int) -> tuple[float, dict[str, Any]]:
        t0 = time.perf_counter()
        r = self.c.put(f"{BASE}{cid}/", params=self.params,
                       json={"action": "scale_cluster", "additional_nodes": 1})  # fmt: skip
        if r.status_code != 200:
            raise RuntimeError(f"scale failed: {r.status_code} {r.text}")
        data = self.wait_running(cid)
        return time.perf_counter() - t0, data

    def delete(self, cid: int, timeout_s: float = 180) -> float:
        t0 = time.perf_counter()
        r = self.c.delete(f"{BASE}{cid}/", params=self.params)
        if r.status_code not in (200, 404):
            raise RuntimeError(f"delete failed: {r.status_code} {r.text}")
        deadline = time.monotonic() + timeout_s
        while self.get(cid).status_code != 404:
            if time.monotonic() > deadline:
                raise RuntimeError(f"cluster {cid} still there {timeout_s:.0f} s after DELETE")
            time.sleep(POLL_S)
        self.live.discard(cid)
        return time.perf_counter() - t0


def bump_cluster_ids(home: Path) -> None:
    """Write a deleted placeholder training cluster with id PLACEHOLDER_ID, so this
    server's clusters (and so its node names, gy-tc<id>-...) do not meet those of an
    e2e run on the same engine, whose fresh stores start at 1."""
    settings = Settings(home=home, database_url=None)
    engine, sessions = open_store(settings)
    try:
        with sessions.begin() as session:
            if session.get(TrainingCluster, PLACEHOLDER_ID) is not None:
                return
            project = session.scalars(select(Project)).first()
            if project is None:
                raise RuntimeError("the server has not created its default project")
            now = datetime.now(UTC)
            session.add(
                TrainingCluster(
                    id=PLACEHOLDER_ID, account_id=project.account_id, project_id=project.id,
                    location="local", name="bench-placeholder",
                    status=TrainingStatus.DELETED.value, status_reason="bench id placeholder",
                    image_version_id=0, gpu_type=GPU, gpus_per_node=1, cpus_per_node=1,
                    memory_gb_per_node=1, ssh_key_ids=[], security_group_ids=[], munge_key="",
                    next_worker=1, created_at=now, updated_at=now, deleted_at=now,
                )
            )  # fmt: skip
    finally:
        engine.dispose()


# ------------------------------------------------------------------ baseline (by hand)


class Bare:
    """One Slurm cluster built with SlurmNodeRuntime directly: what the operator does,
    without the API, the store, placement or the edge rules."""

    def __init__(self, rt: SlurmNodeRuntime, tag: str, authorized_keys: str) -> None:
        self.rt = rt
        self.prefix = f"gy-bench-{os.getpid()}-{tag}"
        self.controller = f"{self.prefix}-controller"
        self.network = f"{self.prefix}-net"
        self.volume = f"{self.prefix}-slurmstate"
        self.workers: list[str] = []
        conf = slurm_conf(self.prefix, self.controller, 64).encode()
        self.files: dict[str, tuple[bytes, int]] = {
            "munge.key": (secrets.token_bytes(1024), 0o400),
            "slurm.conf": (conf, 0o644),
            "authorized_keys": (authorized_keys.encode(), 0o600),
        }

    def _spec(self, name: str, worker_index: int | None) -> NodeSpec:
        labels = {LABEL_BENCH: self.prefix}
        if worker_index is None:
            return NodeSpec(name=name, role="controller", image=SLURM_IMAGE, network=self.network,
                            cpus=2, memory_gb=4, gpu_count=0, labels=labels,
                            state_volume=self.volume)  # fmt: skip
        return NodeSpec(name=name, role="worker", image=SLURM_IMAGE, network=self.network,
                        cpus=WORKER_CPUS, memory_gb=WORKER_MEMORY_GB, gpu_count=1,
                        gpu_indices=(worker_index - 1,), labels=labels)  # fmt: skip

    def _add_worker(self) -> None:
        index = len(self.workers) + 1
        name = f"{self.prefix}-worker-{index}"
        files = {**self.files, "gres.conf": (gres_conf(1).encode(), 0o644)}
        self.rt.create_node(self._spec(name, index), files)
        self.workers.append(name)

    def create(self) -> float:
        t0 = time.perf_counter()
        self.rt.ensure_network(self.network)
        self.rt.create_node(self._spec(self.controller, None), self.files)
        self._add_worker()
        self._add_worker()
        self.rt.wait_slurm_ready(self.controller, self.workers, READY_TIMEOUT_S)
        return time.perf_counter() - t0

    def scale(self) -> float:
        t0 = time.perf_counter()
        self._add_worker()
        self.rt.wait_slurm_ready(self.controller, self.workers, READY_TIMEOUT_S)
        return time.perf_counter() - t0

    def remove(self) -> float:
        t0 = time.perf_counter()
        for name in [self.controller, *self.workers]:
            self.rt.remove_node(name)
        self.rt.remove_network(self.network)
        self.rt.remove_volume(self.volume)
        return time.perf_counter() - t0


# ------------------------------------------------------------------ srun paths


def ssh_argv(key: Path, host: str, port: int) -> list[str]:
    return ["ssh", "-i", str(key), "-p", str(port), "-o", "StrictHostKeyChecking=no",
            "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes",
            "-o", "IdentitiesOnly=yes", "-o", "ConnectTimeout=10", "-o", "LogLevel=ERROR",
            f"root@{host}"]  # fmt: skip


def timed_srun(argv: list[str], expect: set[str]) -> float:
    """Run ``argv`` (ending in ``srun -N2 hostname``) and check it ran on two workers."""
    t0 = time.perf_counter()
    p = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    dt = time.perf_counter() - t0
    hosts = p.stdout.split()
    if p.returncode != 0 or len(hosts) != 2 or not set(hosts) <= expect:
        raise RuntimeError(f"{argv[0]} srun failed ({p.returncode}): {p.stdout} {p.stderr}")
    return dt


def one_round(
    i: int,
    gy: Gpuyard,
    bare: Bare,
    rt: SlurmNodeRuntime,
    ssh_key: Path,
    srun_reps: int,
    live_bare: list[Bare],
    notes: list[str],
) -> dict[str, list[float]]:
    """One round: create and scale on both sides (order flipped on odd rounds), srun
    by the three paths on the gpuyard cluster, then both teardowns."""
    got: dict[str, list[float]] = {k: [] for k in RESULT_KEYS}
    state: dict[str, Any] = {}

    def gy_part() -> None:
        cid, dt, _ = gy.create(f"bench-{i + 1}")
        got["gy_create"].append(dt)
        dt, data = gy.scale(cid)
        got["gy_scale"].append(dt)
        # Checked outside the timed window, on Slurm itself (the view's partition
        # state is cached for up to 2 s).
        nodes = dict(rt.sinfo(node_names(rt, cid).controller))
        if len(nodes) != 3 or set(nodes.values()) - USABLE:
            raise RuntimeError(f"after scale, Slurm shows {nodes}")
        state["cid"], state["data"] = cid, data

    def bare_part() -> None:
        live_bare.append(bare)
        got["bare_create"].append(bare.create())
        got["bare_scale"].append(bare.scale())

    for part in [gy_part, bare_part] if i % 2 == 0 else [bare_part, gy_part]:
        part()

    # srun on the gpuyard cluster by three paths, rotated.
    cid, data = state["cid"], state["data"]
    names = node_names(rt, cid)
    workers = {names.worker(k) for k in (1, 2, 3)}
    address = rt.node_address(names.controller, names.network)
    if address is None:
        raise RuntimeError(f"{names.controller} has no address")
    srun = "srun -N2 hostname"
    paths: list[tuple[str, list[str]]] = [
        ("srun_fwd", [*ssh_argv(ssh_key, "127.0.0.1", data["ssh"]["port"]), srun]),
        ("srun_direct", [*ssh_argv(ssh_key, address, 22), srun]),
        ("srun_exec", ["podman", "exec", names.controller, *srun.split()]),
    ]
    for label, argv in paths:
        # One unmeasured run each (first ssh, first step on the new nodes). Seen once
        # here: the first step after `running` failed ("Task launch ... Communication
        # connection failure") while other containers were starting; retried, reported.
        for attempt in range(3):
            try:
                timed_srun(argv, workers)
                break
            except RuntimeError as e:
                if attempt == 2:
                    raise
                notes.append(f"round {i + 1} {label}: unmeasured first srun failed, retried: "
                             + " ".join(str(e).split())[:300])  # fmt: skip
                time.sleep(1)
    for j in range(srun_reps):
        for k in range(len(paths)):
            label, argv = paths[(j + k) % len(paths)]
            got[label].append(timed_srun(argv, workers))

    # Teardown, in the same flipped order.
    def gy_down() -> None:
        got["gy_delete"].append(gy.delete(cid))

    def bare_down() -> None:
        got["bare_remove"].append(bare.remove())
        live_bare.remove(bare)

    for part in [gy_down, bare_down] if i % 2 == 0 else [bare_down, gy_down]:
        part()
    return got


def vanished(rt: SlurmNodeRuntime, gy: Gpuyard, bares: list[Bare]) -> list[str]:
    """Our node containers that are gone although nothing of ours removed them."""
    names: list[str] = []
    for cid in sorted(gy.live):
        r = gy.get(cid)
        if r.status_code == 200:
            names += [n["name"] for n in r.json()["data"]["nodes"]]
    for b in bares:
        names += [b.controller, *b.workers]
    return [n for n in names if rt.node_state(n) == "missing"]


# ------------------------------------------------------------------ report


def row(name: str, xs: list[float], unit: str) -> str:
    scale = 1000.0 if unit == "ms" else 1.0
    fmt = "{:>9.0f}" if unit == "ms" else "{:>9.2f}"
    cells = " ".join(fmt.format(v * scale) for v in (median(xs), min(xs), max(xs)))
    return f"{name:<58} {cells}  {unit} (n={len(xs)})"


def ratio_line(what: str, gy: list[float], bare: list[float], vs: str) -> str:
    return f"{what:<28} gpuyard/{vs}: median {median(gy) / median(bare):.2f}x"


def node_names(rt: SlurmNodeRuntime, cluster_id: int) -> NodeName:
    """The server's names for a training cluster's nodes (the bench acts for its
    installation: ``rt`` is bound to the server's installation id)."""
    return NodeName(cluster_id, rt.engine.owner.training_prefix(cluster_id))


def engine_sweep(url: str, rt: SlurmNodeRuntime, cluster_ids: list[int]) -> None:
    """Remove whatever a failed run left: our baseline nodes, and our gpuyard clusters'
    containers, networks and volumes (never another run's)."""
    engine = docker.DockerClient(base_url=url)
    try:
        prefixes = [f"gy-bench-{os.getpid()}-"] + [
            f"{node_names(rt, c).prefix}-" for c in cluster_ids
        ]
        for container in engine.containers.list(all=True):
            if any(container.name.startswith(p) for p in prefixes):
                container.remove(force=True, v=True)
        for network in engine.networks.list():
            if any(network.name.startswith(p) for p in prefixes):
                network.remove()
        for volume in engine.volumes.list():
            if any(volume.name.startswith(p) for p in prefixes):
                volume.remove(force=True)
    except Exception as e:  # best effort
        print(f"cleanup: {e}", file=sys.stderr)
    finally:
        engine.close()
    # The installation's host firewall chain (runtimes/hosts/firewall.py) and its
    # training clusters' SSH rules (runtimes/hosts/edge.py).
    if rt.engine.firewall is not None:
        rt.engine.firewall.remove()
    try:
        IptablesEdge(rt.engine.owner.short).uninstall()
    except Exception as e:  # best effort
        print(f"cleanup: {e}", file=sys.stderr)


def diagnose(rt: SlurmNodeRuntime, cluster_ids: list[int], bares: list[Bare]) -> None:
    """On a failure: what the engine and Slurm show for the clusters still there."""
    clusters = [(node_names(rt, c).controller, rt.list_nodes("gpuyard.training_cluster_id", str(c)))
                for c in cluster_ids]  # fmt: skip
    clusters += [(b.controller, [b.controller, *b.workers]) for b in bares]
    for controller, nodes in clusters:
        print(f"--- {controller} ---", file=sys.stderr)
        try:
            print(f"sinfo: {rt.sinfo(controller)}", file=sys.stderr)
        except Exception as e:
            print(f"sinfo: {e}", file=sys.stderr)
        for name in nodes:
            logs = subprocess.run(["podman", "logs", "--tail", "8", name],
                                  capture_output=True, text=True)  # fmt: skip
            print(f"{name}: {rt.node_state(name)}\n{logs.stdout}{logs.stderr}", file=sys.stderr)


def local_image_id(name: str) -> str:
    p = subprocess.run(["podman", "image", "inspect", "--format", "{{.Id}}", name],
                       capture_output=True, text=True)  # fmt: skip
    return p.stdout.strip()[:12] or "?"


def podman_version() -> str:
    try:
        return subprocess.run(
            ["podman", "--version"], capture_output=True, text=True
        ).stdout.split()[-1]
    except (OSError, IndexError):
        return "?"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--srun-reps", type=int, default=5, help="srun round trips per path and round")
    args = ap.parse_args()
    for tool in ("podman", "ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            print(f"{tool} is not installed", file=sys.stderr)
            return 2

    # A short path: unix socket paths are limited to 108 bytes.
    work = Path(tempfile.mkdtemp(prefix="gy-bench-"))
    service = PodmanService(work / "podman.sock")
    server: subprocess.Popen[bytes] | None = None
    home = work / "home"
    log = work / "server.log"
    url = ""
    base = ""
    key = ""
    live_gy: set[int] = set()
    live_bare: list[Bare] = []
    rt: SlurmNodeRuntime | None = None
    try:
        url = service.start()
        t_img = time.perf_counter()
        build_slurm_image("podman", SLURM_IMAGE)
        if time.perf_counter() - t_img > 5:
            print(f"built {SLURM_IMAGE} in {time.perf_counter() - t_img:.0f} s", flush=True)
        ssh_key = work / "id_ed25519"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "bench", "-f",
                        str(ssh_key)], check=True)  # fmt: skip
        pub = (work / "id_ed25519.pub").read_text().strip()

        port = free_port()
        env = {k: v for k, v in os.environ.items() if k != "GPUYARD_DATABASE_URL"}
        env.update({
            "GPUYARD_HOME": str(home), "GPUYARD_PORT": str(port), "GPUYARD_ENGINE_URL": url,
            "GPUYARD_LOCAL_GPUS": f"{GPU}:8", "GPUYARD_LOCAL_VCPUS": "32",
            "GPUYARD_LOCAL_MEMORY_GB": "256", "GPUYARD_LOCAL_DISK_GB": "1000",
            "GPUYARD_PORT_RANGE_START": str(PORT_RANGE[0]),
            "GPUYARD_PORT_RANGE_END": str(PORT_RANGE[1]),
            "GPUYARD_RESERVED_IPS": RESERVED_IPS, "GPUYARD_TRAINING_BIND_ADDRESS": "127.0.0.1",
            "GPUYARD_TRAINING_READY_TIMEOUT_S": str(int(READY_TIMEOUT_S)),
        })  # fmt: skip
        server, base, key = start_server(home, port, env, log)
        bump_cluster_ids(home)

        # The baseline nodes are made for the server's installation (its label and id),
        # so the bench's clean-up and the server's views agree on what is whose.
        label = installation_label(home)
        assert label is not None
        rt = SlurmNodeRuntime(
            url,
            owner=Ownership(label.split("=", 1)[1]),
            policy=EnginePolicy(manage_host_firewall=True),
        )
        rt.node_state("gy-bench-warm-up")  # the SDK client and its version probe, untimed

        results: dict[str, list[float]] = {k: [] for k in RESULT_KEYS}
        notes: list[str] = []
        with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"},
                          timeout=120) as c:  # fmt: skip
            projects = c.get("/v1/projects").json()["data"]
            projects = projects if isinstance(projects, list) else projects["projects"]
            params = {"project_id": projects[0]["id"], "location": "local"}
            images = c.get("/v1/images").json()["data"]
            images = images if isinstance(images, list) else images["images"]
            image_id = next(i["id"] for i in images if i["image"] == SLURM_IMAGE)
            r = c.post("/v1/ssh-keys", json={"name": "bench", "public_key": pub})
            r.raise_for_status()
            gy = Gpuyard(c, params, image_id, r.json()["data"]["id"], live_gy)

            for i in range(args.rounds):
                for attempt in range(1, MAX_ATTEMPTS + 1):
                    tag = f"r{i + 1}" if attempt == 1 else f"r{i + 1}a{attempt}"
                    bare = Bare(rt, tag, pub + "\n")
                    try:
                        got = one_round(i, gy, bare, rt, ssh_key, args.srun_reps, live_bare, notes)
                        break
                    except (RuntimeError, GpuyardError) as e:
                        gone = vanished(rt, gy, live_bare)
                        if not gone or attempt == MAX_ATTEMPTS:
                            raise
                        # Another process removed our containers (the training e2e
                        # tests' clean-up sweeps every gy-tc* container): redo the round.
                        notes.append(f"round {i + 1} discarded ({str(e)[:200]}); removed by "
                                     f"another process: {', '.join(gone)}; run again")  # fmt: skip
                        print(f"  {notes[-1]}", flush=True)
                        for cid in sorted(gy.live):
                            gy.delete(cid)
                        for b in list(live_bare):
                            b.remove()
                            live_bare.remove(b)
                for k, v in got.items():
                    results[k] += v
                n = args.srun_reps
                print(f"  round {i + 1}/{args.rounds}: create gpuyard {got['gy_create'][0]:.2f} s"
                      f" / bare {got['bare_create'][0]:.2f} s; scale gpuyard "
                      f"{got['gy_scale'][0]:.2f} s / bare {got['bare_scale'][0]:.2f} s; srun "
                      f"fwd {median(got['srun_fwd'][-n:]) * 1000:.0f} ms / direct ssh "
                      f"{median(got['srun_direct'][-n:]) * 1000:.0f} ms / exec "
                      f"{median(got['srun_exec'][-n:]) * 1000:.0f} ms", flush=True)  # fmt: skip

        res = results
        print()
        print(f"Training clusters over {args.rounds} rounds (controller + 2 workers, 1 GPU each, "
              f"scale +1), podman {podman_version()}, image {SLURM_IMAGE} ({local_image_id(SLURM_IMAGE)}), "
              f"cpus={os.cpu_count()}; "
              f"API polled every {POLL_S * 1000:.0f} ms")  # fmt: skip
        print(f"{'':<58} {'median':>9} {'min':>9} {'max':>9}")
        print(row("gpuyard create -> running (POST, GET poll)", res["gy_create"], "s"))
        print(row("bare SlurmNodeRuntime 3 nodes + wait_slurm_ready", res["bare_create"], "s"))
        print(row("gpuyard scale_cluster +1 -> running", res["gy_scale"], "s"))
        print(row("bare create_node worker + wait_slurm_ready", res["bare_scale"], "s"))
        print(row("srun -N2 hostname: ssh via the host's DNAT rules", res["srun_fwd"], "ms"))
        print(row("srun -N2 hostname: ssh to the controller's IP", res["srun_direct"], "ms"))
        print(row("srun -N2 hostname: podman exec controller", res["srun_exec"], "ms"))
        print(row("(reference) gpuyard DELETE -> 404", res["gy_delete"], "s"))
        print(row("(reference) bare remove 4 nodes, network, volume", res["bare_remove"], "s"))
        print()
        print(ratio_line("create -> ready", res["gy_create"], res["bare_create"], "bare"))
        print(ratio_line("scale +1 -> idle", res["gy_scale"], res["bare_scale"], "bare"))
        print(ratio_line("srun round trip", res["srun_fwd"], res["srun_exec"], "podman exec"))
        print(ratio_line("srun round trip", res["srun_fwd"], res["srun_direct"], "direct ssh"))
        print(ratio_line("delete (reference)", res["gy_delete"], res["bare_remove"], "bare"))
        print(f"RATIO median gpuyard/bare: create {median(res['gy_create']) / median(res['bare_create']):.2f}x, "
              f"scale {median(res['gy_scale']) / median(res['bare_scale']):.2f}x, "
              f"srun {median(res['srun_fwd']) / median(res['srun_exec']):.2f}x vs podman exec "
              f"({median(res['srun_fwd']) / median(res['srun_direct']):.2f}x vs direct ssh)")  # fmt: skip
        for note in notes:
            print(f"note: {note}")
        return 0
    except Exception:
        lines = tail(log, 200_000).splitlines()
        print("--- server log (no access lines) ---", file=sys.stderr)
        print("\n".join(x for x in lines if "uvicorn.access" not in x)[-4000:], file=sys.stderr)
        if rt is not None:
            diagnose(rt, sorted(live_gy), live_bare)
        raise
    finally:
        if server is not None and server.poll() is None and key and live_gy:
            try:
                with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"},
                                  timeout=60) as c:  # fmt: skip
                    projects = c.get("/v1/projects").json()["data"]
                    projects = projects if isinstance(projects, list) else projects["projects"]
                    params = {"project_id": projects[0]["id"], "location": "local"}
                    cleaner = Gpuyard(c, params, 0, 0, live_gy)
                    for cid in sorted(live_gy):
                        cleaner.delete(cid)
            except Exception as e:  # best effort; the engine sweep below catches leftovers
                print(f"cleanup: {e}", file=sys.stderr)
        stop_process(server)
        for bare in live_bare:
            try:
                bare.remove()
            except Exception as e:
                print(f"cleanup: {e}", file=sys.stderr)
        if url and rt is not None:
            engine_sweep(url, rt, sorted(live_gy))
        service.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
