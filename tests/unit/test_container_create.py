"""A cluster's container is made with one engine request, meaning what the SDK's
``containers.create`` would have sent (runtimes/engines/container_create.py): its
ports (a private one on loopback only), volume, account network (and only it),
limits, disk size, GPUs, command, labels. Nothing is asked of the engine about the
container afterwards. A recording stand-in for the SDK's low-level client."""

from __future__ import annotations

from typing import Any

import docker.errors

from gpuyard.core.ownership import Ownership
from gpuyard.runtimes.base import LABEL_CLUSTER, ContainerSpec, PortBinding
from gpuyard.runtimes.engines.engine import EnginePolicy
from gpuyard.runtimes.engines.runtime import DockerEngineRuntime


class _Api:
    api_version = "1.41"

    def __init__(self, owner: Ownership) -> None:
        self.owner = owner
        self.requests: list[tuple[str, Any]] = []

    def create_container(self, **kwargs: Any) -> dict[str, Any]:
        self.requests.append(("create_container", kwargs))
        return {"Id": "c0ffee", "Warnings": []}

    def inspect_container(self, name: str) -> dict[str, Any]:
        self.requests.append(("inspect_container", name))
        raise docker.errors.NotFound(f"no container {name}")

    def inspect_volume(self, name: str) -> dict[str, Any]:
        self.requests.append(("inspect_volume", name))
        return {"Name": name, "Labels": self.owner.labels()}

    def inspect_network(self, name: str) -> dict[str, Any]:
        self.requests.append(("inspect_network", name))
        return {"Name": name, "Labels": self.owner.labels()}


class _Client:
    def __init__(self, owner: Ownership) -> None:
        self.api = _Api(owner)

    def version(self) -> dict[str, Any]:
        return {"Components": [{"Name": "Podman Engine"}]}


def test_one_request_makes_the_container_as_specified() -> None:
    owner = Ownership.new()
    client = _Client(owner)
    rt = DockerEngineRuntime(
        None,
        owner=owner,
        policy=EnginePolicy(allow_unisolated_networks=True),
        client=client,
    )
    spec = ContainerSpec(
        cluster_id="c1",
        image="localhost/gpuyard/busybox:latest",
        command=("sleep", "600"),
        entrypoint=(),
        env={"A": "1"},
        ports=(PortBinding(8888, 20000, "tcp"), PortBinding(22, 20001, "tcp", host_ip="127.0.0.1")),
        volume_name="gyvol1",
        volume_mount_path="/workspace",
        cpu_cores=2,
        memory_gb=4,
        gpu_indices=(0,),
        gpu_uuids=("GPU-1",),
        container_disk_gb=20,
        account_id=7,
    )
    assert rt.create(spec) == "c0ffee"
    creates = [r for r in client.api.requests if r[0] == "create_container"]
    (sent,) = [kwargs for _, kwargs in creates]
    # Nothing asked about the container once made (the SDK's model object would).
    name = owner.container("c1")
    after = client.api.requests[client.api.requests.index(creates[0]) + 1 :]
    assert after == []
    network = owner.account_network(7)
    assert sent["name"] == name and sent["hostname"] == "c1"
    assert sent["image"] == spec.image
    assert sent["command"] == ["sleep", "600"] and sent["entrypoint"] == [""]
    assert sent["environment"] == {"A": "1"}
    assert owner.owns(sent["labels"]) and sent["labels"][LABEL_CLUSTER] == "c1"
    assert sorted(sent["ports"]) == [("22", "tcp"), ("8888", "tcp")]
    assert sent["volumes"] == ["/workspace"]
    assert sent["networking_config"] == {network: None}
    host = sent["host_config"]
    assert host["PortBindings"] == {
        "8888/tcp": [{"HostIp": "", "HostPort": "20000"}],
        "22/tcp": [{"HostIp": "127.0.0.1", "HostPort": "20001"}],
    }
    assert host["Binds"] == ["gyvol1:/workspace:rw"]
    assert host["NetworkMode"] == network
    assert host["NanoCpus"] == 2_000_000_000 and host["Memory"] == 4 * 1024**3
    assert host["StorageOpt"] == {"size": "20G"}
    (gpus,) = host["DeviceRequests"]
    assert gpus["Driver"] == "nvidia" and gpus["DeviceIDs"] == ["GPU-1"]
