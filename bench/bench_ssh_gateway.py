"""scp through the SSH gateway vs scp straight to the container's sshd.

Set-up: a private Podman service, the real server (``python -m gpuyard serve``, which
starts the gateway as its own process) on a temp home, one cluster of the Slurm node
image running ``sshd`` with port 22 published, and an Ed25519 key registered to the
admin account (``/v1/ssh-keys``). A file of random bytes (200 MiB by default) lies in
a temp directory.

- **gateway:** ``scp -P GATEWAY FILE CLUSTER@127.0.0.1:/root/x`` — the system scp
  (SFTP protocol, OpenSSH 9) to the gateway, which bridges the session to the
  container's sshd over its own SSH connection (decrypts and re-encrypts every byte).
- **direct (baseline):** ``scp -P PUBLISHED FILE root@127.0.0.1:/root/x`` — the same
  client, the same key (the gateway's key sync wrote it into authorized_keys), straight
  to the published port. The floor for moving these bytes into the container.

Both upload the same file with the client's default algorithms; each run is checked
(sha256 in the container). Runs alternate, the order flips each round, and the median
rates are compared. Goal: gateway >= 0.7x direct. Downloads are measured the same way
and reported beside. Needs root, podman, ssh/scp and the Slurm image (built on first
use, about a minute). Cleans up: the server, its containers and volumes (by
installation id), the Podman service, the temp directory.

    .venv/bin/python bench/bench_ssh_gateway.py [--rounds 3] [--mib 200]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx
from _common import (
    cpu_seconds,
    free_port,
    installation_label,
    median,
    start_server,
    stop_process,
    tail,
)
from tests.e2e.conftest import purge_installation

from gpuyard.runtimes.engines.url import PodmanService
from gpuyard.runtimes.slurm.image import SLURM_IMAGE, build_slurm_image

MIB = 1 << 20
SSHD_ARGS = "sh -c 'mkdir -p /run/sshd && ssh-keygen -A >/dev/null && exec /usr/sbin/sshd -D -e'"


def wait_port(port: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as s:
            s.settimeout(0.5)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port}")


def ssh_options(key: Path) -> list[str]:
    return [
        "-i", str(key), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
        "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
        "-o", "LogLevel=ERROR",
    ]  # fmt: skip


def run(argv: list[str], timeout_s: float = 600) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:3])}... failed ({done.returncode}): {done.stderr}")
    return done.stdout


def timed_scp(key: Path, port: int, src: str, dst: str) -> float:
    started = time.perf_counter()
    run(["scp", *ssh_options(key), "-P", str(port), src, dst])
    return time.perf_counter() - started


def remote_sha(key: Path, port: int, user: str, path: str) -> str:
    out = run(["ssh", *ssh_options(key), "-p", str(port), f"{user}@127.0.0.1", f"sha256sum {path}"])
    return out.split()[0]


def gateway_pid(server_pid: int) -> int | None:
    """The ``gpuyard ssh-gateway`` child of the server."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (entry / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == server_pid and b"ssh-gateway" in cmdline:
            return int(entry.name)
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mib", type=int, default=200)
    args = parser.parse_args()
    if os.geteuid() != 0 or shutil.which("podman") is None or shutil.which("scp") is None:
        print("needs root, podman and scp", file=sys.stderr)
        return 1

    work = Path(tempfile.mkdtemp(prefix="gy-bench-ssh-"))
    service = PodmanService(work / "podman.sock")
    server = None
    label = None
    try:
        engine_url = service.start()
        build_slurm_image("podman", SLURM_IMAGE)
        home, log = work / "home", work / "server.log"
        port, gw_port = free_port(), free_port()
        start = random.randrange(30000, 39900)
        env = {
            **os.environ,
            "GPUYARD_HOME": str(home),
            "GPUYARD_PORT": str(port),
            "GPUYARD_ENGINE_URL": engine_url,
            "GPUYARD_LOCAL_VCPUS": "8",
            "GPUYARD_LOCAL_MEMORY_GB": "32",
            "GPUYARD_LOCAL_DISK_GB": "100",
            "GPUYARD_RECONCILE_INTERVAL_S": "0.5",
            "GPUYARD_PROXY_ENABLED": "false",
            "GPUYARD_SSH_PORT": str(gw_port),
            "GPUYARD_SSH_BIND": "127.0.0.1",
            "GPUYARD_PORT_RANGE_START": str(start),
            "GPUYARD_PORT_RANGE_END": str(start + 99),
        }
        server, base, api_key = start_server(home, port, env, log)
        wait_port(gw_port)
        key = work / "id_ed25519"
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)])
        with httpx.Client(
            base_url=base, headers={"Authorization": f"Bearer {api_key}"}, timeout=60
        ) as c:
            r = c.post(
                "/v1/ssh-keys",
                json={"name": "bench", "public_key": key.with_suffix(".pub").read_text()},
            )
            r.raise_for_status()
            r = c.post(
                "/v1/clusters",
                json={
                    "name": "bench-ssh", "docker_image": SLURM_IMAGE, "docker_args": SSHD_ARGS,
                    "memory_gb": 2, "cpu_cores": 2, "volume_gb": 1,
                    "ports": [{"internal_port": 22, "external_port": 0, "protocol": "tcp"}],
                },
            )  # fmt: skip
            r.raise_for_status()
            cid = r.json()["data"]["id"]
            deadline = time.monotonic() + 120
            while True:
                data = c.get(f"/v1/clusters/{cid}").json()["data"]
                if data["status"] == "running":
                    break
                if data["status"] == "error" or time.monotonic() > deadline:
                    raise RuntimeError(f"cluster did not start: {data.get('error_message')}")
                time.sleep(0.2)
            label = installation_label(home)
            direct_port = data["ports"][0]["external_port"]
            wait_port(direct_port)
        # One login through the gateway writes the keys into the container.
        run(["ssh", *ssh_options(key), "-p", str(gw_port), f"{cid}@127.0.0.1", "true"])
        src = work / "blob"
        with src.open("wb") as f:
            for _ in range(args.mib):
                f.write(os.urandom(MIB))
        digest = hashlib.sha256(src.read_bytes()).hexdigest()
        ways = {
            "gateway": (gw_port, cid),
            "direct": (direct_port, "root"),
        }
        gw_pid = gateway_pid(server.pid)
        assert gw_pid is not None, "no gateway process"
        gw_cpu: list[float] = []
        up: dict[str, list[float]] = {w: [] for w in ways}
        down: dict[str, list[float]] = {w: [] for w in ways}
        order = list(ways)
        for _ in range(args.rounds):
            for way in order:
                p, user = ways[way]
                cpu_before = cpu_seconds(gw_pid)
                seconds = timed_scp(key, p, str(src), f"{user}@127.0.0.1:/root/blob")
                if way == "gateway":
                    gw_cpu.append(cpu_seconds(gw_pid) - cpu_before)
                assert remote_sha(key, p, user, "/root/blob") == digest, way
                up[way].append(args.mib / seconds)
                back = work / f"back-{way}"
                seconds = timed_scp(key, p, f"{user}@127.0.0.1:/root/blob", str(back))
                assert hashlib.sha256(back.read_bytes()).hexdigest() == digest, way
                back.unlink()
                down[way].append(args.mib / seconds)
            order.reverse()
        print(f"scp of {args.mib} MiB (random), {args.rounds} rounds, MiB/s (median; all runs)")
        print(f"{'path':10} {'upload':>10} {'download':>10}   runs (up / down)")
        for way in ways:
            ups = ", ".join(f"{v:.0f}" for v in up[way])
            downs = ", ".join(f"{v:.0f}" for v in down[way])
            print(f"{way:10} {median(up[way]):10.1f} {median(down[way]):10.1f}   {ups} / {downs}")
        cpu = median(gw_cpu)
        print(
            f"gateway process CPU per upload: {cpu:.2f} s (one core's ceiling: "
            f"{args.mib / cpu:.0f} MiB/s); {os.cpu_count()} CPUs, load average "
            f"{os.getloadavg()[0]:.1f}"
        )
        ratio_up = median(up["gateway"]) / median(up["direct"])
        ratio_down = median(down["gateway"]) / median(down["direct"])
        verdict = "met" if ratio_up >= 0.7 else "NOT met"
        print(f"download ratio gateway/direct: {ratio_down:.2f}x")
        print(f"RATIO gateway/direct upload: {ratio_up:.2f}x (goal >= 0.7x: {verdict})")
        return 0
    except Exception as exc:
        print(f"set-up failed: {exc}", file=sys.stderr)
        if (work / "server.log").exists():
            print(tail(work / "server.log"), file=sys.stderr)
        return 1
    finally:
        stop_process(server)
        if label is not None:
            # Only what this server made (its installation id), networks and rules too.
            purge_installation(service.url, label.split("=", 1)[1])
        service.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
