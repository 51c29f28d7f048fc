"""The start's pre-checks, read in one transaction (reconciler/clusters/start_checks.py),
answer for the cluster being started only: another account's cluster still stopping
on the same GPUs of the same host holds the start back; on other GPUs, or once it has
stopped, it does not, and the cluster's own row never does. Real database, fake
runtime."""

from __future__ import annotations

from sqlalchemy import update

from gpuyard.core.states import ClusterStatus
from gpuyard.reconciler.clusters.start_checks import read_start_checks
from gpuyard.reconciler.loop import Reconciler
from gpuyard.services.clusters import use_cases as uc
from gpuyard.services.context import Context
from gpuyard.services.tenancy.auth import Principal
from gpuyard.store.schema import Cluster
from tests.service.test_lifecycle import a6000, settle


def _set(ctx: Context, cid: str, **values: object) -> None:
    with ctx.transaction() as s:
        s.execute(update(Cluster).where(Cluster.id == cid).values(**values))


def _load(ctx: Context, cid: str) -> Cluster:
    with ctx.read() as s:
        c = s.get(Cluster, cid)
        assert c is not None
        return c


def test_only_a_stopping_cluster_on_the_same_gpus_holds_a_start_back(
    ctx: Context, alice: Principal, bob: Principal, rec: Reconciler
) -> None:
    mine = uc.create_cluster(ctx, alice, a6000(1))
    theirs = uc.create_cluster(ctx, bob, a6000(1))
    settle(rec, theirs.id)
    c = _load(ctx, mine.id)
    other = _load(ctx, theirs.id)
    assert c.host_id == other.host_id and c.gpu_indices != other.gpu_indices
    checks = read_start_checks(ctx, c)
    assert not checks.gpus_held and not checks.snapshot_reading
    assert checks.move is None and checks.restore is None
    # Bob's cluster still stopping on (a stale claim to) Alice's GPU: she waits.
    _set(ctx, theirs.id, status=ClusterStatus.STOPPING.value, gpu_indices=c.gpu_indices)
    assert read_start_checks(ctx, c).gpus_held
    # Once it has stopped, or while it stops on other GPUs, she does not.
    _set(ctx, theirs.id, status=ClusterStatus.STOPPED.value)
    assert not read_start_checks(ctx, c).gpus_held
    _set(ctx, theirs.id, status=ClusterStatus.STOPPING.value, gpu_indices=other.gpu_indices)
    assert not read_start_checks(ctx, c).gpus_held
    # Her own row never holds her back.
    _set(ctx, mine.id, status=ClusterStatus.STOPPING.value)
    assert not read_start_checks(ctx, _load(ctx, mine.id)).gpus_held
