"""SkyPilot 0.14.1, unmodified, launches on gpuyard as on RunPod: ``sky check runpod``,
``sky launch`` of a one-GPU task on a real Podman container (simulated GPUs), ``sky
exec`` on it, ``sky down``, and the gpuyard cluster terminated afterwards.

SkyPilot is no dependency of gpuyard: its client lives in a virtual environment in
the machine's cache and the pod's image (sshd, rsync, SkyPilot's runtime and Ray,
offline) is built once by tests/e2e/skypilot_image.py and reused by its content tag.
The client runs under a temporary HOME holding ``~/.runpod/config.toml`` and a
catalog made from gpuyard's own GraphQL answers, its local API server on a port of
this test's own; everything it launched is taken down in a ``finally`` (``sky
down``, then gpuyard's API, then ``sky api stop``). One test function: it is the
slowest of the suite (minutes).
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import socket
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e import skypilot_image
from tests.e2e.test_server_e2e import running_server
from tests.helpers import free_port
from tests.required_parts import as_root, first_problem, need, on_path

pytestmark = pytest.mark.e2e

# SkyPilot's name of the GPU (a key of its RunPod GPU_NAME_MAP) and gpuyard's id.
ACCELERATOR = "RTXA6000"
GPU_TYPE = "NVIDIA RTX A6000"
# The data centre the pod is asked for: the local host's location.
ZONE = "GY-LOCAL-1"
REGION = "US"
PORTS_QUERY = "query { myself { pods { runtime { ports { ip isIpPublic privatePort type } } } } }"
GPU_QUERY = """query { gpuTypes(input: {id: "%s"}) { id displayName manufacturer memoryInGb
  securePrice secureSpotPrice lowestPrice(input: {gpuCount: 1}) {
    minVcpu minMemory maxUnreservedGpuCount compliance } } }"""


def _reachable(host: str, port: int) -> str | None:
    try:
        with socket.create_connection((host, port), timeout=10):
            return None
    except OSError as e:
        return f"{host}:{port} cannot be reached ({e})"


@pytest.fixture(scope="session")
def skypilot() -> tuple[Path, str]:
    """SkyPilot's ``sky`` and the pod image's name (built when missing)."""
    need("podman", on_path("podman"), how="apt-get install podman runc")
    need(
        "debootstrap",
        first_problem(on_path("debootstrap"), as_root()),
        how="apt-get install debootstrap; run the tests as root",
    )
    need("rsync", on_path("rsync"), how="apt-get install rsync (bash scripts/setup-system.sh)")
    cached = (skypilot_image.WHEELS / ".complete").exists() and (
        skypilot_image.VENV / "bin" / "sky"
    ).exists()
    if not cached:
        need(
            "network (Debian's mirror, PyPI)",
            first_problem(_reachable("deb.debian.org", 80), _reachable("pypi.org", 443)),
            how="allow HTTP to deb.debian.org and HTTPS to pypi.org (the first run only)",
        )
    try:
        sky = skypilot_image.sky_bin()
        image = skypilot_image.build_image()
    except skypilot_image.BuildFailed as e:
        pytest.fail(f"building SkyPilot's client or pod image failed: {e}", pytrace=False)
    return sky, image


def write_catalog(home: Path, gpu: dict[str, Any]) -> None:
    """SkyPilot's RunPod catalog (schema v8) for the one GPU type, from gpuyard's answer:
    user-made (no .meta/*.md5 beside it), so it is never fetched from the internet."""
    price = gpu["lowestPrice"]
    vcpus = float(price["minVcpu"])
    memory = float(price["minMemory"])
    info = (
        f"{{'Gpus': [{{'Name': '{gpu['displayName']}', 'Manufacturer': "
        f"'{gpu['manufacturer']}', 'Count': 1, 'MemoryInfo': {{'SizeInMiB': "
        f"{gpu['memoryInGb']}}}}}], 'TotalGpuMemoryInMiB': {gpu['memoryInGb']}}}"
    )
    root = home / ".sky" / "catalogs" / "v8"
    (root / "runpod").mkdir(parents=True)
    (root / "common").mkdir(parents=True)
    (root / "runpod" / "vms.csv").write_text(
        "InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,Region,SpotPrice,"
        "Price,AvailabilityZone,GpuInfo\n"
        f"1x_{ACCELERATOR}_SECURE,{ACCELERATOR},1.0,{vcpus},{memory},{REGION},"
        f'{gpu["secureSpotPrice"]},{gpu["securePrice"]},{ZONE},"{info}"\n'
    )
    (root / "common" / "accelerators.csv").write_text(
        f"AcceleratorName,Clouds\n{ACCELERATOR},\"['RunPod']\"\n"
    )
    (root / "common" / "metadata.csv").write_text(
        f"GPU,MemoryGB,Manufacturer\n{ACCELERATOR},{gpu['memoryInGb']},{gpu['manufacturer']}\n"
    )


class Sky:
    """The ``sky`` command under its own HOME and local API server port."""

    def __init__(self, sky: Path, home: Path, base_url: str) -> None:
        self.sky, self.home = sky, home
        self.env = {
            "PATH": f"{sky.parent}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "HOME": str(home),
            "LANG": "C.UTF-8",
            # The runpod SDK appends /graphql; SkyPilot's local API server copies the
            # client's environment when it starts.
            "RUNPOD_API_BASE_URL": base_url,
            "SKYPILOT_API_SERVER_LOCAL_PORT": str(free_port()),
            "SKYPILOT_DISABLE_USAGE_COLLECTION": "1",
            "SKYPILOT_DEBUG": "0",
            # Its temporary files under the test's own folder.
            "TMPDIR": str(home / "tmp"),
        }
        (home / "tmp").mkdir(parents=True, exist_ok=True)
        self.transcript: list[str] = []

    def __call__(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        began = time.monotonic()
        try:
            proc = subprocess.run(
                [str(self.sky), *args],
                env=self.env,
                capture_output=True,
                text=True,
                timeout=timeout,
                stdin=subprocess.DEVNULL,
                check=False,
            )
        except subprocess.TimeoutExpired as e:
            out = (
                e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else e.stdout or ""
            )
            self.transcript.append(
                f"$ sky {' '.join(args)}  (timed out after {timeout:g} s)\n{out}"
            )
            raise AssertionError(self.why(f"sky {' '.join(args)} timed out")) from e
        took = time.monotonic() - began
        self.transcript.append(
            f"$ sky {' '.join(args)}  (exit {proc.returncode}, {took:.0f} s)\n"
            f"{proc.stdout[-4000:]}{proc.stderr[-4000:]}"
        )
        return proc

    def why(self, what: str) -> str:
        """A failure's message: what failed, the commands' output and the API server's log."""
        log = self.home / ".sky" / "api_server" / "server.log"
        tail = log.read_text(errors="replace")[-4000:] if log.exists() else "(no server log)"
        return f"{what}\n" + "\n".join(self.transcript)[-12000:] + f"\nAPI server log:\n{tail}"


def lines_of(proc: subprocess.CompletedProcess[str]) -> list[str]:
    return [line.strip() for line in (proc.stdout + proc.stderr).splitlines()]


def live_clusters(c: httpx.Client) -> list[dict[str, Any]]:
    r = c.get("/v1/clusters", params={"per_page": 100})
    assert r.status_code == 200, r.text
    data = r.json()["data"]
    listed = data if isinstance(data, list) else data["clusters"]
    return [x for x in listed if x["status"] != "terminated"]


@pytest.fixture
def server_env() -> dict[str, str]:
    return {
        "GPUYARD_LOCAL_GPUS": f"{GPU_TYPE}:1",
        # SkyPilot asks 4 vCPUs and the GPU's memory per GPU.
        "GPUYARD_LOCAL_VCPUS": "32",
        "GPUYARD_LOCAL_MEMORY_GB": "256",
        "GPUYARD_LOCAL_LOCATION": ZONE,
    }


# The first run builds SkyPilot's venv and the pod image (debootstrap) in its setup,
# four minutes and more on a loaded 2-core machine, before sky's own launch.
@pytest.mark.timeout(1200)
def test_skypilot_launches_execs_and_downs_a_pod(
    tmp_path: Path, engine_url: str, skypilot: tuple[Path, str], server_env: dict[str, str]
) -> None:
    sky_path, image = skypilot
    name = f"gy-{uuid.uuid4().hex[:6]}"
    with (
        running_server(tmp_path / "gpuyard", engine_url, server_env) as server,
        server.client() as c,
    ):
        home = tmp_path / "home"
        (home / ".runpod").mkdir(parents=True)
        (home / ".runpod" / "config.toml").write_text(f'[default]\napi_key = "{server.key}"\n')
        answer = c.post("/graphql", json={"query": GPU_QUERY % GPU_TYPE}).json()
        assert "errors" not in answer, answer
        gpu = answer["data"]["gpuTypes"][0]
        assert gpu["lowestPrice"]["maxUnreservedGpuCount"] == 1, gpu
        assert gpu["lowestPrice"]["compliance"] == [], gpu
        write_catalog(home, gpu)
        sky = Sky(sky_path, home, server.url)
        began = time.monotonic()
        try:
            check = sky("check", "runpod", timeout=300)
            assert check.returncode == 0, sky.why("sky check runpod failed")
            assert any("RunPod" in line and "enabled" in line for line in lines_of(check)), sky.why(
                "sky check did not enable RunPod"
            )

            launch = sky(
                "launch", "-y", "--infra", "runpod", "-c", name,
                "--gpus", f"{ACCELERATOR}:1", "--disk-size", "10",
                "--image-id", f"docker:{image}",
                "echo hello-from-sky",
                timeout=1200,
            )  # fmt: skip
            assert launch.returncode == 0, sky.why("sky launch failed")
            assert any(line.endswith("hello-from-sky") for line in lines_of(launch)), sky.why(
                "the task's output is not in sky launch's"
            )
            [cluster] = live_clusters(c)
            # SkyPilot names its pod after the cluster's name on the cloud, plus -head.
            assert cluster["name"].startswith(name) and cluster["name"].endswith("-head"), cluster
            assert cluster["status"] == "running" and cluster["gpu_count"] == 1, cluster
            # What SkyPilot connected through: SSH public on loopback, the http ports at
            # the container's own address on its network.
            pods = c.post("/graphql", json={"query": PORTS_QUERY}).json()["data"]["myself"]
            [ports] = [p["runtime"]["ports"] for p in pods["pods"]]
            ssh = [p for p in ports if p["privatePort"] == 22]
            assert [(p["ip"], p["isIpPublic"]) for p in ssh] == [("127.0.0.1", True)], ports
            internal = {p["ip"] for p in ports if p["type"] == "http"}
            assert len(internal) == 1 and ipaddress.ip_address(internal.pop()).is_private, ports

            again = sky("exec", name, "echo again", timeout=600)
            assert again.returncode == 0, sky.why("sky exec failed")
            assert any(line.endswith("again") for line in lines_of(again)), sky.why(
                "the exec's output is not in sky exec's"
            )

            down = sky("down", "-y", name, timeout=600)
            assert down.returncode == 0, sky.why("sky down failed")
            deadline = time.monotonic() + 120
            while live_clusters(c) and time.monotonic() < deadline:
                time.sleep(1)
            assert live_clusters(c) == [], sky.why("the cluster was not terminated")
            done = c.get(f"/v1/clusters/{cluster['id']}").json()["data"]
            assert done["status"] == "terminated", done
            print(f"SkyPilot check, launch, exec and down: {time.monotonic() - began:.0f} s")
        finally:
            sky("down", "-y", name, timeout=600)
            for left in live_clusters(c):
                c.delete(f"/v1/clusters/{left['id']}")
            deadline = time.monotonic() + 60
            while live_clusters(c) and time.monotonic() < deadline:
                time.sleep(1)
            sky("api", "stop", timeout=120)
            # SSH's control sockets, which SkyPilot keeps in /tmp by its user's hash.
            user_hash = home / ".sky" / "user_hash"
            if user_hash.exists():
                shutil.rmtree(f"/tmp/sky_ssh_{user_hash.read_text().strip()}", ignore_errors=True)
