"""Disk sizes on real Podman: a write past a volume's size fails with ENOSPC inside the
container (a cluster's own volume, a network volume, a volume grown while mounted),
sparse files count by their blocks in the usage the API reports, and a host whose
storage cannot hold a container disk to its size refuses clusters unless allowed.

This machine's engine storage is ext4 without project quotas, so container disk
sizes cannot be enforced here: the refusal is what is tested (docs/decisions.md
"Disk sizes"; on XFS with ``pquota`` the engine applies ``storage_opt``)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest

from gpuyard.core.ownership import LABEL_SIZE, Ownership
from gpuyard.runtimes.engines.engine import EnginePolicy
from gpuyard.runtimes.engines.runtime import DockerEngineRuntime
from gpuyard.runtimes.fleet import HostEngine
from gpuyard.runtimes.hosts.firewall import subprocess_runner
from gpuyard.runtimes.hosts.runtimes import HostEngineRuntime, host_runtime_factory
from gpuyard.runtimes.hosts.ssh_tunnel import SshKeys
from gpuyard.runtimes.volumes.copy import copy_volume, volume_checksum
from gpuyard.runtimes.volumes.images import VolumeImages
from tests.e2e import podman_host
from tests.e2e.conftest import DEV_IMAGE, purge_installation
from tests.e2e.test_server_e2e import ServerProcess, running_server, sh, wait_status
from tests.helpers import free_port
from tests.required_parts import as_root, first_problem, needs, on_path

pytestmark = [
    pytest.mark.e2e,
    # Sized volumes are loop-mounted ext4 images.
    needs(
        "root and e2fsprogs",
        first_problem(as_root(), on_path("mkfs.ext4")),
        how="run the tests as root; apt-get install e2fsprogs",
    ),
]

MIB = 1024**2
NO_SPACE = "No space left on device"


@pytest.fixture
def sized(tmp_path: Path, engine_url: str) -> Iterator[tuple[DockerEngineRuntime, Ownership]]:
    owner = Ownership.new()
    images = VolumeImages(subprocess_runner, str(tmp_path / "images"))
    rt = DockerEngineRuntime(engine_url, owner=owner, volume_images=images)
    try:
        yield rt, owner
    finally:
        purge_installation(engine_url, owner.installation_id)


def run_on(
    engine: docker.DockerClient, owner: Ownership, volume: str, command: str
) -> tuple[int, str]:
    """Run ``command`` in a fresh container of ours with ``volume`` at /w."""
    container = engine.containers.run(
        DEV_IMAGE,
        ["sh", "-c", command],
        volumes={volume: {"bind": "/w", "mode": "rw"}},
        labels=owner.labels(),
        detach=True,
    )
    try:
        code = int(container.wait(timeout=120)["StatusCode"])
        return code, container.logs().decode(errors="replace")
    finally:
        container.remove(force=True)


def test_a_write_past_a_volumes_size_fails_and_a_grown_volume_holds_more(
    sized: tuple[DockerEngineRuntime, Ownership], engine: docker.DockerClient, tmp_path: Path
) -> None:
    rt, owner = sized
    volume = f"{owner.prefix}-sized"
    rt.engine.ensure_volume(volume, {LABEL_SIZE: str(64 * MIB)})
    assert rt.capabilities().disk_problem is None or "container disk" in str(
        rt.capabilities().disk_problem
    )
    code, out = run_on(engine, owner, volume, "dd if=/dev/zero of=/w/f bs=1M count=100")
    assert code != 0 and NO_SPACE in out, out

    # Sparse files count by their blocks: a 4 GiB hole and 8 MiB of data.
    code, out = run_on(
        engine,
        owner,
        volume,
        "rm -f /w/f && truncate -s 4G /w/sparse && dd if=/dev/zero of=/w/data bs=1M count=8",
    )
    assert code == 0, out
    used = rt.volume_usage()[volume]
    assert 8 * MIB <= used < 24 * MIB, used

    # Grown while unused: the file system grows with its image.
    rt.engine.ensure_volume(volume, {LABEL_SIZE: str(160 * MIB)})
    code, out = run_on(engine, owner, volume, "dd if=/dev/zero of=/w/f bs=1M count=100 && sync")
    assert code == 0, out

    # Grown while mounted by a running container: online where the host may resize a
    # mounted file system (CAP_SYS_RESOURCE), else at its next mount.
    holder = engine.containers.run(
        DEV_IMAGE,
        ["sleep", "300"],
        volumes={volume: {"bind": "/w", "mode": "rw"}},
        labels=owner.labels(),
        detach=True,
    )
    try:
        code, out = _exec(holder, "dd if=/dev/zero of=/w/g bs=1M count=100")
        assert code != 0 and NO_SPACE in out, out
        rt.engine.ensure_volume(volume, {LABEL_SIZE: str(320 * MIB)})  # never raises
        if may_resize_mounted():
            code, out = _exec(holder, "rm -f /w/g && dd if=/dev/zero of=/w/g bs=1M count=100")
            assert code == 0, out
    finally:
        holder.remove(force=True)
    if not may_resize_mounted():
        code, out = run_on(engine, owner, volume, "dd if=/dev/zero of=/w/g bs=1M count=100")
        assert code != 0, out  # still its old size: the grow waits ...
        rt.engine.ensure_volume(volume, {LABEL_SIZE: str(320 * MIB)})  # ... for this
        code, out = run_on(
            engine, owner, volume, "rm -f /w/g && dd if=/dev/zero of=/w/g bs=1M count=100"
        )
        assert code == 0, out

    image = tmp_path / "images" / f"{volume}.img"
    assert image.exists()
    rt.remove_volume(volume)
    assert not image.exists()  # removed with the volume


def may_resize_mounted() -> bool:
    """Whether this process may grow a mounted ext4 (CAP_SYS_RESOURCE; a sandbox may
    drop it even for root)."""
    status = Path("/proc/self/status").read_text()
    effective = int(status.split("CapEff:")[1].split()[0], 16)
    return bool(effective >> 24 & 1)


def _exec(container: Any, command: str) -> tuple[int, str]:
    code, out = container.exec_run(["sh", "-c", command])
    return int(code), out.decode(errors="replace")


def wait_used(c: httpx.Client, path: str, at_least: int, timeout: float = 60) -> dict[str, Any]:
    """Poll ``path`` until its measured ``used_bytes`` (top level or under ``volume``)
    is at least ``at_least``."""
    deadline = time.monotonic() + timeout
    while True:
        data: dict[str, Any] = c.get(path).json()["data"]
        used = data.get("used_bytes", (data.get("volume") or {}).get("used_bytes"))
        if used is not None and used >= at_least:
            return data
        assert time.monotonic() < deadline, data
        time.sleep(0.2)


def test_clusters_and_network_volumes_are_held_to_their_sizes(
    tmp_path: Path, engine_url: str, engine: docker.DockerClient
) -> None:
    env = {
        "GPUYARD_VOLUME_IMAGE_DIR": str(tmp_path / "images"),
        "GPUYARD_VOLUME_USAGE_INTERVAL_S": "0.5",
    }
    with running_server(tmp_path / "home", engine_url, env) as server, server.client() as c:
        body = {
            "gpu_type": "NVIDIA RTX A6000",
            "docker_image": DEV_IMAGE,
            "cpu_cores": 1,
            "memory_gb": 1,
        }
        r = c.post("/v1/clusters", json={**body, "name": "own", "volume_gb": 1})
        assert r.status_code == 201, r.text
        own = r.json()["data"]["id"]
        r = c.post("/v1/networkvolumes", json={"name": "nv", "size": 1, "dataCenterId": "local"})
        assert r.status_code == 201, r.text
        vid = r.json()["data"]["id"]
        r = c.post("/v1/clusters", json={**body, "name": "net", "network_volume_id": vid})
        assert r.status_code == 201, r.text
        net = r.json()["data"]["id"]
        for cid in (own, net):
            data = wait_status(c, cid, {"running", "error"})
            assert data["status"] == "running", (data.get("error_message"), server.log_tail())

        # 1 GB: 900 MiB fit, 200 MiB more do not.
        fill = "fallocate -l 900M /workspace/big && dd if=/dev/zero of=/workspace/f bs=1M count=200"
        for cid in (own, net):
            code, out = sh(engine, server, cid, fill)
            assert code != 0 and NO_SPACE in out, (cid, out)

        # A sparse file counts by its blocks in the usage the API reports: 64 MiB of
        # data and a 50 GB hole.
        code, out = sh(
            engine,
            server,
            own,
            "rm -f /workspace/big /workspace/f && truncate -s 50G /workspace/s && "
            "dd if=/dev/zero of=/workspace/d bs=1M count=64 && sync",
        )
        assert code == 0, out
        data = wait_used(c, f"/v1/clusters/{own}", 64 * MIB)
        assert data["volume"]["used_bytes"] < 512 * MIB, data["volume"]

        # Grown while its cluster runs: the larger size holds at once where the host may
        # resize a mounted file system, else from the cluster's next start.
        r = c.patch(f"/v1/networkvolumes/{vid}", json={"size": 2})
        assert r.status_code == 200, r.text
        if not may_resize_mounted():
            assert c.post(f"/v1/clusters/{net}/stop").status_code == 200
            wait_status(c, net, {"stopped"})
            assert c.post(f"/v1/clusters/{net}/start", json={}).status_code == 200
            data = wait_status(c, net, {"running", "error"})
            assert data["status"] == "running", data
        code, out = sh(engine, server, net, "rm -f /workspace/f && " + fill.split(" && ")[1])
        assert code == 0, out
        code, out = sh(engine, server, net, "df -k /workspace | tail -n 1")
        assert int(out.split()[1]) > 1_500_000, out


def test_a_host_that_cannot_hold_container_disks_refuses_clusters(
    tmp_path: Path, engine_url: str
) -> None:
    server = ServerProcess(tmp_path / "home", engine_url, free_port())
    server.extra_env = {
        "GPUYARD_ALLOW_UNENFORCED_DISK": "false",
        "GPUYARD_VOLUME_IMAGE_DIR": str(tmp_path / "images"),
    }
    try:
        server.start()
        with server.client() as c:
            body = {"gpu_type": "NVIDIA RTX A6000", "docker_image": DEV_IMAGE, "cpu_cores": 1}
            r = c.post("/v1/clusters", json={**body, "name": "first", "container_disk_gb": 5})
            assert r.status_code == 201, r.text
            first = r.json()["data"]["id"]
            # The engine refuses the size on this ext4 storage: never started without it.
            deadline = time.monotonic() + 90
            while True:
                data = c.get(f"/v1/clusters/{first}").json()["data"]
                assert data["status"] != "running", data
                hosts = c.get("/v1/hosts").json()["data"]["hosts"]
                if not hosts[0]["enforces_disk"]:
                    break
                assert time.monotonic() < deadline, (data, hosts)
                time.sleep(0.2)
            assert "container disk" in hosts[0]["disk_note"], hosts[0]
            r = c.post("/v1/clusters", json={**body, "name": "second"})
            assert r.status_code == 409, r.text
            assert r.json()["error"]["code"] == "DISK_NOT_ENFORCED", r.text
            assert "GPUYARD_ALLOW_UNENFORCED_DISK" in r.json()["error"]["message"]
    finally:
        server.cleanup()


def test_a_copy_of_a_sized_volume_is_sized_and_identical(
    sized: tuple[DockerEngineRuntime, Ownership], engine: docker.DockerClient
) -> None:
    """Moves, restores and clones write through the engine's archive upload into a
    stopped helper: the files must land in the sized file system, not under it."""
    rt, owner = sized
    source, target = f"{owner.prefix}-src", f"{owner.prefix}-dst"
    rt.engine.ensure_volume(source, {LABEL_SIZE: str(64 * MIB)})
    code, out = run_on(
        engine,
        owner,
        source,
        "mkdir -p /w/d && echo hello > /w/d/f && dd if=/dev/zero of=/w/big bs=1M count=8",
    )
    assert code == 0, out
    copy_volume(rt.engine, source, rt.engine, target)
    assert volume_checksum(rt.engine, target) == volume_checksum(rt.engine, source)
    options = engine.api.inspect_volume(target)["Options"]
    assert options.get("device", "").endswith(f"{target}.img"), options
    code, out = run_on(
        engine, owner, target, "cat /w/d/f && dd if=/dev/zero of=/w/x bs=1M count=80"
    )
    assert "hello" in out and code != 0 and NO_SPACE in out, out


@needs("simulated hosts", podman_host.available(), how=podman_host.HOSTS_HOW)
def test_a_sized_volume_moves_to_a_host_reached_over_ssh(
    sized: tuple[DockerEngineRuntime, Ownership], engine_url: str, tmp_path: Path
) -> None:
    """The image is made on the target host through its SSH connection, at the
    source's size, and the copy lands in it."""
    local, owner = sized
    keys = SshKeys(tmp_path / "home")
    with podman_host.PodmanHost(ssh_key=keys.public_key()) as sim:
        sim.load_image(engine_url, DEV_IMAGE)
        make = host_runtime_factory(
            keys.dir.parent,
            EnginePolicy(),
            timeout_s=10,
            volume_image_dir=str(tmp_path / "remote-images"),
        )
        remote = make(HostEngine(7, "sim", sim.ssh_url))
        assert isinstance(remote, HostEngineRuntime)
        remote.bind(owner)
        try:
            assert remote.available() is None
            volume = f"{owner.prefix}-moved"
            local.engine.ensure_volume(volume, {LABEL_SIZE: str(64 * MIB)})
            code, out = run_on(local.engine.client(), owner, volume, "echo kept > /w/f && sync")
            assert code == 0, out
            copy_volume(local.engine, volume, remote.engine, volume)
            options = remote.engine.api.inspect_volume(volume)["Options"]
            assert options.get("device") == str(tmp_path / "remote-images" / f"{volume}.img")
            code, out = run_on(
                remote.engine.client(),
                owner,
                volume,
                "cat /w/f && dd if=/dev/zero of=/w/x bs=1M count=80",
            )
            assert "kept" in out and code != 0 and NO_SPACE in out, out
            remote.remove_volume(volume)
            assert not (tmp_path / "remote-images" / f"{volume}.img").exists()
        finally:
            remote.close()
