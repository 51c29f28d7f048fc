"""Tenant limits never silently disappear: a host whose engine refuses CPU/memory
limits says so, and creates there fail with a clear error unless the operator allows
it; the docker-engine runtime never drops limits on its own."""

from __future__ import annotations

from typing import Any

import docker.errors
import pytest
from sqlalchemy import select

from gpuyard.core.errors import LimitsNotEnforced, RuntimeFailure
from gpuyard.core.ownership import Ownership
from gpuyard.reconciler.loop import Reconciler
from gpuyard.runtimes.base import ContainerSpec
from gpuyard.runtimes.engines.engine import EnginePolicy
from gpuyard.runtimes.engines.runtime import DockerEngineRuntime
from gpuyard.services.clusters import use_cases as uc
from gpuyard.services.context import Context
from gpuyard.services.tenancy.auth import Principal
from gpuyard.store.schema import Host
from gpuyard.testing.fake_runtime import FakeRuntime
from tests.service.test_lifecycle import a6000


def test_host_shows_unenforced_limits_and_creates_are_refused(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime
) -> None:
    runtime.limits_problem = "cgroup memory controller not delegated"
    rec.observe()
    with ctx.read() as s:
        host = s.scalars(select(Host)).one()
        assert host.enforces_limits is False
        assert host.limits_note == "cgroup memory controller not delegated"
    with pytest.raises(LimitsNotEnforced) as refused:
        uc.create_cluster(ctx, alice, a6000(1))
    assert "GPUYARD_ALLOW_UNENFORCED_LIMITS" in refused.value.message
    assert uc.list_clusters(ctx, alice).total == 0  # nothing stored
    ctx.settings.allow_unenforced_limits = True
    assert uc.create_cluster(ctx, alice, a6000(1)).status == "starting"
    runtime.limits_problem = None
    rec.observe()
    with ctx.read() as s:
        assert s.scalars(select(Host)).one().enforces_limits is True
    rec.stop()


class _Api:
    """The SDK's low-level client: what the runtime's create sends (runtimes/engines/
    container_create.py), refused the way an engine without cgroup limits does."""

    api_version = "1.41"

    def __init__(self) -> None:
        self.created: list[dict[str, Any]] = []

    def info(self) -> dict[str, Any]:
        return {}  # nothing told of its storage

    def create_container(self, **kwargs: Any) -> dict[str, Any]:
        host_config = kwargs.get("host_config") or {}
        if "NanoCpus" in host_config or "Memory" in host_config:
            raise docker.errors.APIError(
                "refused", explanation="crun: opening file `cpu.cfs_quota_us`: cgroup not found"
            )
        self.created.append(kwargs)
        return {"Id": "c0ffee"}

    def inspect_volume(self, name: str) -> dict[str, Any]:
        return {"Name": name}

    def inspect_container(self, name: str) -> dict[str, Any]:
        raise docker.errors.NotFound(f"no container {name}")


class _Client:
    def __init__(self) -> None:
        self.api = _Api()

    def version(self) -> dict[str, Any]:
        return {"Components": [{"Name": "Podman Engine"}]}


def _spec() -> ContainerSpec:
    return ContainerSpec(
        cluster_id="c1",
        image="img",
        command=None,
        env={},
        ports=(),
        volume_name=None,
        volume_mount_path="/workspace",
        cpu_cores=2,
        memory_gb=4,
        gpu_indices=(),
    )


@pytest.mark.parametrize("allowed", [False, True])
def test_runtime_refuses_instead_of_dropping_limits(allowed: bool) -> None:
    rt = DockerEngineRuntime(
        "unix:///nowhere.sock",
        owner=Ownership.new(),
        policy=EnginePolicy(allow_unenforced_limits=allowed),
    )
    client = _Client()
    rt.engine._client_obj = client  # the engine client, injected
    if not allowed:
        with pytest.raises(RuntimeFailure) as refused:
            rt.create(_spec())
        assert "cannot enforce CPU/memory limits" in refused.value.message
        assert client.api.created == []
        # Refused again next time: limits are never switched off for everyone.
        with pytest.raises(RuntimeFailure):
            rt.create(_spec())
    else:
        assert rt.create(_spec()) == "c0ffee"
        (kwargs,) = client.api.created
        assert "NanoCpus" not in kwargs["host_config"] and "Memory" not in kwargs["host_config"]
    caps = rt.capabilities()
    assert caps.cpu_limits is False and "cgroup" in (caps.limits_problem or "")
