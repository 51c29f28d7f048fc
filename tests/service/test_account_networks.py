"""Clusters of different accounts land on different networks (no route between them);
clusters of one account share one."""

from __future__ import annotations

from gpuyard.reconciler.loop import Reconciler
from gpuyard.services.clusters import use_cases as uc
from gpuyard.services.clusters.requests import CreateCluster, StartCluster
from gpuyard.services.context import Context
from gpuyard.services.tenancy.auth import Principal
from gpuyard.testing.fake_runtime import FakeRuntime


def create(ctx: Context, rec: Reconciler, who: Principal) -> str:
    request = CreateCluster.model_validate({"docker_image": "img", "volume_gb": 0})
    cid = uc.create_cluster(ctx, who, request).id
    for _ in range(5):
        rec.driver.drive(cid)
    assert uc.get_cluster(ctx, who, cid).status == "running"
    return cid


def test_accounts_are_isolated_and_an_account_shares_its_network(
    ctx: Context, alice: Principal, bob: Principal, rec: Reconciler, runtime: FakeRuntime
) -> None:
    a1, a2 = create(ctx, rec, alice), create(ctx, rec, alice)
    b1, b2 = create(ctx, rec, bob), create(ctx, rec, bob)
    assert alice.account_id != bob.account_id
    assert runtime.containers[a1].spec.account_id == alice.account_id
    assert runtime.network_of(a1) == ctx.ownership.account_network(alice.account_id)
    assert runtime.network_of(b1) == ctx.ownership.account_network(bob.account_id)
    assert runtime.can_reach(a1, a2) and runtime.can_reach(b2, b1)
    for mine, theirs in ((b1, a1), (b2, a2), (a1, b1), (a2, b2)):
        assert not runtime.can_reach(mine, theirs), (mine, theirs)


def test_restart_keeps_the_cluster_on_its_account_network(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime
) -> None:
    a1 = create(ctx, rec, alice)
    uc.stop_cluster(ctx, alice, a1)
    for _ in range(5):
        rec.driver.drive(a1)
    uc.start_cluster(ctx, alice, a1, StartCluster())
    for _ in range(5):
        rec.driver.drive(a1)
    assert runtime.network_of(a1) == ctx.ownership.account_network(alice.account_id)
    assert set(runtime.networks) == {ctx.ownership.account_network(alice.account_id)}
