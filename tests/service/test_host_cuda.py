"""A host's CUDA driver version as the fleet keeps it: what the engine's host says
(nvidia-smi) is recorded unless the operator declared a version, which wins until it
is set back to null; the database's candidate query filters by it, numerically."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from gpuyard.core.errors import Forbidden
from gpuyard.core.fleet import PlacementPolicy
from gpuyard.core.models import ResourceRequest
from gpuyard.core.placement import AllocationRatios
from gpuyard.runtimes.records import EngineInventory
from gpuyard.services.capacity.candidates import candidate_hosts, cuda_versions
from gpuyard.services.context import Context
from gpuyard.services.fleet.admin import set_cuda_version
from gpuyard.services.fleet.health import record_inventory
from gpuyard.services.tenancy.auth import Principal, Scope, admin_user, issue_key, resolve_key
from gpuyard.store.schema import Host, Member
from tests.helpers import add_host_row

A6000 = "NVIDIA RTX A6000"


def operator(ctx: Context, scope: Scope = Scope.ADMIN) -> Principal:
    with ctx.transaction() as s:
        user = admin_user(s)
        account_id = s.scalar(select(Member.account_id).where(Member.user_id == user.id))
        assert account_id is not None
        key = issue_key(s, user_id=user.id, account_id=account_id, name="op", scope=scope)
    with ctx.read() as s:
        return resolve_key(s, key.key)


def cuda_of(ctx: Context, host_id: int) -> str | None:
    with ctx.read() as s:
        return s.get_one(Host, host_id).cuda_version


def found(cuda: str | None) -> EngineInventory:
    return EngineInventory("podman", "4.3.1", 32, 256, 2000, (), cuda)


def test_discovered_unless_declared(ctx: Context) -> None:
    host = add_host_row(ctx, "gpu-a", 2)
    record_inventory(ctx, host, found("12.6"))
    assert cuda_of(ctx, host) == "12.6"
    record_inventory(ctx, host, found(None))  # nvidia-smi said nothing: kept
    assert cuda_of(ctx, host) == "12.6"
    view = set_cuda_version(ctx, operator(ctx), host, "12.2")
    assert view.cuda_version == "12.2" and "cuda_version" in view.declared
    record_inventory(ctx, host, found("12.8"))
    assert cuda_of(ctx, host) == "12.2"  # declared wins
    set_cuda_version(ctx, operator(ctx), host, None)
    record_inventory(ctx, host, found("12.8"))
    assert cuda_of(ctx, host) == "12.8"
    with pytest.raises(Forbidden):
        set_cuda_version(ctx, operator(ctx, Scope.WRITE), host, "1.0")
    assert cuda_of(ctx, host) == "12.8"


def test_the_candidate_query_compares_versions_as_numbers(ctx: Context) -> None:
    hosts = {}
    for name, version in (("v124", "12.4"), ("v1210", "12.10"), ("v126", "12.6")):
        hosts[version] = add_host_row(ctx, name, 2)
        set_cuda_version(ctx, operator(ctx), hosts[version], version)
    ask = ResourceRequest(A6000, 1, 1, 1, 1, min_cuda_version="12.6")
    with ctx.read() as s:
        assert cuda_versions(s, ask) == ["12.10", "12.6"]
        assert cuda_versions(s, ResourceRequest(A6000, 1, 1, 1, 1)) is None
        got = candidate_hosts(s, ask, AllocationRatios(), PlacementPolicy.BINPACK, limit=10)
    assert {h.host_id for h in got} == {hosts["12.10"], hosts["12.6"]}
    assert all(h.cuda_version in ("12.10", "12.6") for h in got)
