"""A host's engine reached over SSH, as gpuyard reaches a remote server: the engine's
unix socket forwarded with the installation's key, firewall and inventory commands over
SSH. The host is simulated on this machine (its own network namespace, Podman and sshd).
Root, podman and sshd needed."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from gpuyard.core.ownership import Ownership
from gpuyard.runtimes.base import ContainerSpec, ContainerState
from gpuyard.runtimes.engines.engine import EnginePolicy
from gpuyard.runtimes.fleet import HostEngine
from gpuyard.runtimes.hosts.runtimes import HostEngineRuntime, host_runtime_factory
from gpuyard.runtimes.hosts.ssh_tunnel import SshKeys
from tests.e2e.conftest import DEV_IMAGE
from tests.e2e.podman_host import HOSTS_HOW, PodmanHost, available
from tests.required_parts import needs

pytestmark = needs("simulated hosts", available(), how=HOSTS_HOW)


@pytest.fixture
def host(tmp_path: Path, engine_url: str) -> Iterator[tuple[PodmanHost, SshKeys]]:
    keys = SshKeys(tmp_path / "home")
    with PodmanHost(ssh_key=keys.public_key()) as sim:
        sim.load_image(engine_url, DEV_IMAGE)
        yield sim, keys


def runtime_for(sim: PodmanHost, keys: SshKeys) -> HostEngineRuntime:
    make = host_runtime_factory(keys.dir.parent, EnginePolicy(), timeout_s=5)
    runtime = make(HostEngine(7, "sim", sim.ssh_url))
    assert isinstance(runtime, HostEngineRuntime)
    runtime.bind(Ownership("5a1e0000-0000-4000-8000-00000000e2e7"))
    return runtime


def test_a_cluster_runs_on_the_host_reached_over_ssh(
    host: tuple[PodmanHost, SshKeys], engine_url: str
) -> None:
    sim, keys = host
    rt = runtime_for(sim, keys)
    try:
        started = time.monotonic()
        assert rt.available() is None
        print(f"first ping over a fresh tunnel: {time.monotonic() - started:.2f} s")
        found = rt.inventory()
        assert found.engine_name == "podman" and found.vcpus and found.memory_gb
        assert found.disk_gb and found.gpus == ()  # no nvidia-smi there
        spec = ContainerSpec(
            cluster_id="sshcluster0001",
            image=DEV_IMAGE,
            command=None,
            env={},
            ports=(),
            volume_name=rt.engine.owner.volume("sshcluster0001"),
            volume_mount_path="/workspace",
            cpu_cores=1,
            memory_gb=1,
            gpu_indices=(),
            account_id=1,
        )
        rt.ensure_volume(spec.volume_name or "", spec.cluster_id)
        rt.create(spec)
        rt.start(spec.cluster_id)
        assert rt.observe(spec.cluster_id).state == ContainerState.RUNNING
        # It runs on the simulated host, not on this machine's engine.
        main = docker.DockerClient(base_url=engine_url)
        try:
            names = [c.name for c in main.containers.list(all=True)]
        finally:
            main.close()
        assert rt.engine.owner.container(spec.cluster_id) not in names
        # The host's own firewall got our isolation chain (over SSH).
        rules = rt.runner(["iptables", "-S", "FORWARD"]) if rt.runner else None
        assert rules is not None and f"GY-ISO-{rt.engine.owner.short}" in rules.output

        # The tunnel dies: the next heartbeat starts it again.
        assert rt.tunnel is not None
        rt.tunnel.close()
        assert rt.available() is None
        # A real partition: the heartbeat fails within seconds, and recovers.
        sim.down()
        started = time.monotonic()
        assert rt.available() is not None
        assert time.monotonic() - started < 30
        sim.up()
        deadline = time.monotonic() + 30
        while rt.available() is not None:
            assert time.monotonic() < deadline, "the host did not answer again"
            time.sleep(0.5)
        assert rt.observe(spec.cluster_id).state == ContainerState.RUNNING
        rt.stop(spec.cluster_id)
        rt.remove_volume(spec.volume_name or "")
    finally:
        rt.close()
