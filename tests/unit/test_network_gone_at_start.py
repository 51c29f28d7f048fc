"""An account network removed between a container's create and its start (Podman
checks a network's users and removes it without holding off a create in between) is
made again with the container, so the start succeeds (runtimes/engines/runtime.py).

A stand-in engine (the SDK client's calls, answered from dicts) makes the race
happen on cue; tests/e2e/test_network_isolation.py shows the real engine's half: a
network a create just used is not removed as unused."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from gpuyard.core.errors import RuntimeFailure
from gpuyard.core.ownership import Ownership
from gpuyard.runtimes.base import ContainerSpec
from gpuyard.runtimes.engines.engine import EnginePolicy
from gpuyard.runtimes.engines.runtime import DockerEngineRuntime
from tests.unit.test_engine_races import api_error


class StandInEngine:
    """Networks and containers in dicts; ``remove_network_before_start`` makes the
    next start find the container's network gone, as the race leaves it."""

    def __init__(self) -> None:
        self.networks: dict[str, dict[str, str]] = {}
        self.containers: dict[str, dict[str, Any]] = {}
        self.remove_network_before_start = False
        self.started: list[str] = []
        self.created = 0

    # -- the SDK's low-level client ------------------------------------------------
    def inspect_network(self, name: str) -> dict[str, Any]:
        if name not in self.networks:
            raise api_error(404, f"network {name} not found")
        return {"Name": name, "Labels": self.networks[name]}

    def create_network(self, name: str, *, labels: dict[str, str], **_: Any) -> None:
        self.networks[name] = labels

    def inspect_container(self, name: str) -> dict[str, Any]:
        if name not in self.containers:
            raise api_error(404, f"no such container {name}")
        return self.containers[name]

    def remove_container(self, name: str, **_: Any) -> None:
        self.containers.pop(name, None)

    def start(self, name: str) -> None:
        network = self.containers[name]["network"]
        if self.remove_network_before_start:
            self.remove_network_before_start = False
            del self.networks[network]
        if network not in self.networks:
            raise api_error(
                500, f"unable to find network with name or ID {network}: network not found"
            )
        self.started.append(name)

    api_version = "1.41"

    def create_container(self, *, name: str, labels: dict[str, str], **kwargs: Any) -> Any:
        network = kwargs["host_config"]["NetworkMode"]
        if network not in self.networks:
            raise api_error(404, f"network {network} not found")
        self.created += 1
        self.containers[name] = {"Config": {"Labels": labels}, "network": network}
        return {"Id": f"id-{self.created}"}


def runtime_on(stand_in: StandInEngine) -> DockerEngineRuntime:
    client = SimpleNamespace(api=stand_in)
    return DockerEngineRuntime(
        None,
        owner=Ownership.new(),
        policy=EnginePolicy(allow_unisolated_networks=True),
        client=client,
    )


def spec(account_id: int) -> ContainerSpec:
    return ContainerSpec(
        cluster_id="c1",
        image="localhost/gpuyard/busybox:latest",
        command=None,
        env={},
        ports=(),
        volume_name=None,
        volume_mount_path="/workspace",
        cpu_cores=0,
        memory_gb=0,
        gpu_indices=(),
        account_id=account_id,
    )


def test_a_network_removed_between_create_and_start_is_made_again() -> None:
    stand_in = StandInEngine()
    rt = runtime_on(stand_in)
    rt.create(spec(7))
    network = rt.engine.owner.account_network(7)
    assert list(stand_in.networks) == [network]
    stand_in.remove_network_before_start = True
    rt.start("c1")
    assert list(stand_in.networks) == [network]  # made again
    assert stand_in.created == 2  # and the container with it
    assert stand_in.started == [rt.engine.owner.container("c1")]


def test_other_start_failures_are_raised() -> None:
    stand_in = StandInEngine()
    rt = runtime_on(stand_in)
    rt.create(spec(7))

    def refuse(name: str) -> None:
        raise api_error(500, 'exec: "serve": executable file not found in $PATH')

    stand_in.start = refuse  # type: ignore[method-assign]
    with pytest.raises(RuntimeFailure, match="executable file not found"):
        rt.start("c1")
    assert stand_in.created == 1
