"""The node image reaches a host that lacks it without any registry: saved from this
machine's engine, loaded into a simulated host's Podman (its own storage, reached over
TCP across a veth), once per host and image version, keeping its name and id. Root and
podman needed."""

from __future__ import annotations

import os
from collections.abc import Iterator

import docker
import pytest

from gpuyard.core.ownership import Ownership
from gpuyard.runtimes.engines.engine import Engine
from gpuyard.runtimes.slurm.node_image_copy import ensure_node_image
from gpuyard.runtimes.slurm.nodes import SlurmNodeRuntime
from tests.e2e.conftest import DEV_IMAGE
from tests.e2e.podman_host import HOSTS_HOW, PodmanHost, available
from tests.required_parts import needs

pytestmark = [pytest.mark.e2e, needs("simulated hosts", available(), how=HOSTS_HOW)]


@pytest.fixture
def image(engine_url: str) -> Iterator[str]:
    """A tag of our own on the busybox image (the shared one may be rebuilt meanwhile)."""
    name = f"localhost/gpuyard/copy-test-{os.getpid()}:v1"
    client = docker.DockerClient(base_url=engine_url)
    try:
        repository, tag = name.rsplit(":", 1)
        client.images.get(DEV_IMAGE).tag(repository, tag)
        yield name
    finally:
        client.images.remove(name, noprune=True)
        client.close()


@pytest.fixture
def host() -> Iterator[PodmanHost]:
    with PodmanHost() as sim:
        yield sim


def test_a_host_lacking_the_image_gets_it_once(
    engine_url: str, image: str, host: PodmanHost
) -> None:
    source = Engine(engine_url, 60)
    target = Engine(host.url, 60)
    said: list[str] = []
    assert ensure_node_image(target, source, image, said.append)
    source_id = source.api.inspect_image(image)["Id"]
    assert target.api.inspect_image(image)["Id"] == source_id
    assert said and said[0].startswith(f"copying image {image} to the host")
    # Once per host and image version: neither this engine object nor a new one for
    # the same host copies it again.
    assert not ensure_node_image(target, source, image, said.append)
    assert not ensure_node_image(Engine(host.url, 60), source, image)


def test_a_node_runtime_on_a_hosts_engine_copies_from_this_machine(
    engine_url: str, image: str, host: PodmanHost
) -> None:
    owner = Ownership.new()
    local = SlurmNodeRuntime(engine_url, owner=owner)
    remote = SlurmNodeRuntime(
        None, owner=owner, engine=Engine(host.url, 60), image_source=local.engine
    )
    assert remote.engine.base_url == host.url and remote.engine.owner == owner
    assert not local.ensure_image(image)  # this machine's: nothing to copy from
    assert remote.ensure_image(image)
    assert not remote.ensure_image(image)
    assert (
        remote.engine.api.inspect_image(image)["Id"] == local.engine.api.inspect_image(image)["Id"]
    )
