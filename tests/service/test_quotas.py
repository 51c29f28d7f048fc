"""Quotas in the store: checked in the transaction of each create, start, scale and
storage claim (SQLite and PostgreSQL), set by the operator and account admins."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select, update

from gpuyard.core.billing.quotas import GIB, LimitChange
from gpuyard.core.errors import Forbidden, QuotaExceeded, ValidationFailed
from gpuyard.core.roles import Role
from gpuyard.core.training.clusters import CONTROLLER_VCPUS
from gpuyard.reconciler.loop import Reconciler
from gpuyard.reconciler.training.operator import TrainingOperator
from gpuyard.reconciler.wiring import build_reconciler
from gpuyard.services.access.ssh_keys import add_key
from gpuyard.services.billing import quotas
from gpuyard.services.clock import FakeClock
from gpuyard.services.clusters import use_cases as uc
from gpuyard.services.clusters.requests import CreateCluster, StartCluster
from gpuyard.services.context import Context
from gpuyard.services.installation.bootstrap import first_start, open_store, register_local_host
from gpuyard.services.tenancy.auth import Principal, Scope, admin_user
from gpuyard.services.training import use_cases as training
from gpuyard.services.volumes import network_volumes as nvs
from gpuyard.services.volumes.snapshots import create_snapshot, delete_snapshot
from gpuyard.store.schema import (
    AuditEvent,
    Cluster,
    GpuAllocation,
    ImageVersion,
    Project,
    Quota,
    Snapshot,
)
from gpuyard.testing.fake_nodes import FakeNodeRuntime
from gpuyard.testing.fake_runtime import FakeRuntime
from tests.conftest import new_principal
from tests.helpers import make_settings
from tests.service.test_training_operator import KEY, FakeEdge

A6000 = "NVIDIA RTX A6000"


@pytest.fixture
def ctx(database_url: str, tmp_path: Path, clock: FakeClock) -> Iterator[Context]:
    """A store whose one host has room for far more than the quotas allow."""
    settings = make_settings(
        tmp_path / "home",
        database_url,
        local_gpus=f"{A6000}:64",
        local_vcpus=1024,
        local_memory_gb=4096,
        local_disk_gb=100_000,
    )
    engine, sessions = open_store(settings)
    context = Context(sessions=sessions, settings=settings, clock=clock)
    first_start(context)
    register_local_host(context, None)
    yield context
    engine.dispose()


@pytest.fixture
def operator(ctx: Context) -> Principal:
    with ctx.read() as session:
        admin = admin_user(session)
        account_id = session.scalar(select(Project.account_id).order_by(Project.id).limit(1))
        assert account_id is not None
        return Principal(
            key_id=0,
            user_id=admin.id,
            account_id=account_id,
            scope=Scope.ADMIN,
            default_project_id=0,
            operator=True,
        )


@pytest.fixture
def rec(ctx: Context) -> Reconciler:
    return build_reconciler(ctx, FakeRuntime())


def gpus(n: int = 1, **kw: object) -> CreateCluster:
    return CreateCluster.model_validate(
        {"gpu_type": A6000, "gpu_count": n, "docker_image": "img", "cpu_cores": 2, **kw}
    )


def settle(rec: Reconciler, cluster_id: str) -> None:
    for _ in range(6):
        rec.driver.drive(cluster_id)


def limit(
    ctx: Context, who: Principal, p: Principal, project_id: int | None = None, **kw: Any
) -> dict[str, Any]:
    """Set ``p``'s account (or project) limits as ``who``."""
    return quotas.set_quotas(ctx, who, p.account_id, LimitChange(**kw), project_id)


def test_32_concurrent_creates_against_4_gpus(
    ctx: Context, alice: Principal, operator: Principal
) -> None:
    limit(ctx, operator, alice, gpus=4)

    def create(i: int) -> str:
        try:
            return uc.create_cluster(ctx, alice, gpus(1, name=f"c{i}")).id
        except QuotaExceeded as exc:
            assert exc.details["resource"] == "gpus" and exc.details["limit"] == 4
            assert exc.details["in_use"] == 4 and exc.details["asked"] == 1
            return "QUOTA_EXCEEDED"

    with ThreadPoolExecutor(max_workers=32) as pool:
        results = list(pool.map(create, range(32)))

    assert results.count("QUOTA_EXCEEDED") == 28
    assert len({r for r in results if r != "QUOTA_EXCEEDED"}) == 4
    with ctx.read() as session:
        assert session.scalar(select(func.count()).select_from(Cluster)) == 4
        assert session.scalar(select(func.count()).select_from(GpuAllocation)) == 4
        usage = quotas.usage_of(session, alice.account_id)
    assert usage.gpus == 4 and usage.running_clusters == 4 and usage.vcpus == 8


def test_details_and_nothing_stored(ctx: Context, alice: Principal, operator: Principal) -> None:
    limit(ctx, operator, alice, gpus_by_type={A6000: 3}, vcpus=100)
    uc.create_cluster(ctx, alice, gpus(2))
    with pytest.raises(QuotaExceeded) as refused:
        uc.create_cluster(ctx, alice, gpus(2))
    assert refused.value.code == "QUOTA_EXCEEDED" and refused.value.http_status == 403
    assert refused.value.details == {
        "resource": "gpus",
        "scope": "account",
        "account_id": alice.account_id,
        "project_id": None,
        "gpu_type": A6000,
        "limit": 3,
        "in_use": 2,
        "asked": 2,
    }
    with ctx.read() as session:
        assert session.scalar(select(func.count()).select_from(Cluster)) == 1
        assert session.scalar(select(func.count()).select_from(GpuAllocation)) == 2
    # vCPUs too; a CPU-only cluster asks no GPUs.
    with pytest.raises(QuotaExceeded) as cpus:
        uc.create_cluster(ctx, alice, CreateCluster(docker_image="img", cpu_cores=99))
    assert cpus.value.details["resource"] == "vcpus" and cpus.value.details["in_use"] == 2


def test_other_accounts_are_not_counted(
    ctx: Context, alice: Principal, bob: Principal, operator: Principal
) -> None:
    limit(ctx, operator, alice, gpus=2)
    uc.create_cluster(ctx, bob, gpus(4))
    uc.create_cluster(ctx, alice, gpus(2))
    with pytest.raises(QuotaExceeded):
        uc.create_cluster(ctx, alice, gpus(1))
    uc.create_cluster(ctx, bob, gpus(4))


def test_project_quota(ctx: Context, alice: Principal, operator: Principal) -> None:
    with ctx.transaction() as session:
        other = Project(account_id=alice.account_id, name="other")
        session.add(other)
        session.flush()
        other_id = other.id
    limit(ctx, operator, alice, gpus=8)
    limit(ctx, alice, alice, alice.default_project_id, running_clusters=1)
    uc.create_cluster(ctx, alice, gpus(1))
    with pytest.raises(QuotaExceeded) as refused:
        uc.create_cluster(ctx, alice, gpus(1))
    details = refused.value.details
    assert details["scope"] == "project" and details["project_id"] == alice.default_project_id
    assert details["resource"] == "running_clusters" and details["limit"] == 1
    # Another project of the account is held only to the account's limits.
    uc.create_cluster(ctx, alice, gpus(7, project_id=other_id))
    with pytest.raises(QuotaExceeded) as account:
        uc.create_cluster(ctx, alice, gpus(1, project_id=other_id))
    assert account.value.details["scope"] == "account"


def test_start_and_scale(
    ctx: Context, alice: Principal, operator: Principal, rec: Reconciler
) -> None:
    limit(ctx, operator, alice, gpus=3)
    a = uc.create_cluster(ctx, alice, gpus(2))
    settle(rec, a.id)
    uc.stop_cluster(ctx, alice, a.id)
    settle(rec, a.id)
    assert uc.get_cluster(ctx, alice, a.id).status == "stopped"
    b = uc.create_cluster(ctx, alice, gpus(2))
    with pytest.raises(QuotaExceeded) as refused:
        uc.start_cluster(ctx, alice, a.id, StartCluster())
    assert refused.value.details["in_use"] == 2 and refused.value.details["asked"] == 2
    assert uc.get_cluster(ctx, alice, a.id).status == "stopped"
    # Scaled down to fit, it starts.
    body = StartCluster.model_validate({"update_configuration": {"gpu_count": 1}})
    uc.start_cluster(ctx, alice, a.id, body)
    assert uc.get_cluster(ctx, alice, a.id).gpu_count == 1
    settle(rec, a.id)
    settle(rec, b.id)
    # A scale up past the quota is refused and leaves the cluster as it was.
    uc.stop_cluster(ctx, alice, a.id)
    settle(rec, a.id)
    up = StartCluster.model_validate({"update_configuration": {"gpu_count": 3}})
    with pytest.raises(QuotaExceeded) as scaled:
        uc.start_cluster(ctx, alice, a.id, up)
    assert scaled.value.details["asked"] == 3
    stored = uc.get_cluster(ctx, alice, a.id)
    assert stored.status == "stopped" and stored.gpu_count == 1


def test_volume_quota(ctx: Context, alice: Principal, operator: Principal) -> None:
    limit(ctx, operator, alice, volume_gb=100)
    uc.create_cluster(ctx, alice, gpus(1, volume_gb=60))
    with pytest.raises(QuotaExceeded) as refused:
        uc.create_cluster(ctx, alice, gpus(1, volume_gb=50))
    assert refused.value.details["resource"] == "volume_gb"
    assert (refused.value.details["in_use"], refused.value.details["asked"]) == (60, 50)
    where = ctx.settings.local_location
    nv = nvs.create_network_volume(
        ctx, alice, nvs.CreateNetworkVolume(name="d", size=40, dataCenterId=where)
    )
    with pytest.raises(QuotaExceeded):
        nvs.create_network_volume(
            ctx, alice, nvs.CreateNetworkVolume(name="e", size=1, dataCenterId=where)
        )
    with pytest.raises(QuotaExceeded) as grow:
        nvs.update_network_volume(ctx, alice, nv.id, nvs.UpdateNetworkVolume(size=41))
    assert grow.value.details["asked"] == 1 and grow.value.details["in_use"] == 100
    assert nvs.get_network_volume(ctx, alice, nv.id).size_gb == 40


def test_snapshot_quota(
    ctx: Context, alice: Principal, operator: Principal, rec: Reconciler
) -> None:
    limit(ctx, operator, alice, snapshot_gb=20)
    c = uc.create_cluster(ctx, alice, gpus(1, volume_gb=50))
    settle(rec, c.id)
    # Unmeasured, a snapshot may hold the whole 50 GB volume.
    with pytest.raises(QuotaExceeded) as refused:
        create_snapshot(ctx, alice, c.id, "s", "")
    assert refused.value.details["resource"] == "snapshot_gb"
    assert refused.value.details["asked"] == 50
    with ctx.transaction() as session:
        session.execute(update(Cluster).where(Cluster.id == c.id).values(volume_used_bytes=GIB))
    snap = create_snapshot(ctx, alice, c.id, "s", "")
    with ctx.transaction() as session:
        # Taken: its stored bytes count.
        session.execute(
            update(Snapshot)
            .where(Snapshot.id == snap.id)
            .values(status="ready", stored_bytes=19 * GIB + 1)
        )
    with ctx.read() as session:
        assert quotas.usage_of(session, alice.account_id).snapshot_gb == 20
    with pytest.raises(QuotaExceeded):
        create_snapshot(ctx, alice, c.id, "t", "")


def _snap_state(ctx: Context, snap_id: str, **values: Any) -> None:
    with ctx.transaction() as session:
        session.execute(update(Snapshot).where(Snapshot.id == snap_id).values(**values))


def test_snapshot_quota_counts_the_bytes_snapshots_still_hold(
    ctx: Context, alice: Principal, operator: Principal, rec: Reconciler
) -> None:
    limit(ctx, operator, alice, snapshot_gb=20)
    c = uc.create_cluster(ctx, alice, gpus(1, volume_gb=50))
    settle(rec, c.id)
    with ctx.transaction() as session:
        session.execute(
            update(Cluster).where(Cluster.id == c.id).values(volume_used_bytes=15 * GIB)
        )
    first = create_snapshot(ctx, alice, c.id, "first", "")
    _snap_state(ctx, first.id, status="ready", size_bytes=15 * GIB, stored_bytes=15 * GIB)
    # The second finds everything in the repository already: it stores next to nothing.
    with ctx.transaction() as session:
        session.execute(update(Cluster).where(Cluster.id == c.id).values(volume_used_bytes=0))
    second = create_snapshot(ctx, alice, c.id, "second", "")
    _snap_state(ctx, second.id, status="ready", size_bytes=15 * GIB, stored_bytes=4096)
    # Deleting the first leaves its 15 GB in the repository for the second: they count.
    delete_snapshot(ctx, alice, first.id)
    with ctx.read() as session:
        assert quotas.usage_of(session, alice.account_id).snapshot_gb == 15
    with ctx.transaction() as session:
        session.execute(
            update(Cluster).where(Cluster.id == c.id).values(volume_used_bytes=10 * GIB)
        )
    with pytest.raises(QuotaExceeded) as refused:
        create_snapshot(ctx, alice, c.id, "third", "")
    assert refused.value.details["resource"] == "snapshot_gb"
    assert refused.value.details["in_use"] == 15 and refused.value.details["asked"] == 10


def test_a_snapshot_of_an_empty_volume_is_refused_past_the_quota(
    ctx: Context, alice: Principal, operator: Principal, rec: Reconciler
) -> None:
    limit(ctx, operator, alice, snapshot_gb=20)
    c = uc.create_cluster(ctx, alice, gpus(1, volume_gb=50))
    settle(rec, c.id)
    with ctx.transaction() as session:
        session.execute(update(Cluster).where(Cluster.id == c.id).values(volume_used_bytes=GIB))
    snap = create_snapshot(ctx, alice, c.id, "s", "")
    _snap_state(ctx, snap.id, status="ready", size_bytes=20 * GIB, stored_bytes=20 * GIB)
    # The volume was emptied: measured at 0 bytes, its snapshot still stores some.
    with ctx.transaction() as session:
        session.execute(update(Cluster).where(Cluster.id == c.id).values(volume_used_bytes=0))
    with pytest.raises(QuotaExceeded) as refused:
        create_snapshot(ctx, alice, c.id, "t", "")
    assert refused.value.details["in_use"] == 20 and refused.value.details["asked"] == 1
    with ctx.read() as session:
        count = session.scalar(select(func.count()).select_from(Snapshot))
    assert count == 1  # nothing stored


def test_setting_quotas(ctx: Context, alice: Principal, operator: Principal) -> None:
    # Only the operator sets an account's limits.
    with pytest.raises(Forbidden):
        limit(ctx, alice, alice, gpus=100)
    shown = limit(ctx, operator, alice, gpus=8, gpus_by_type={"RTX A6000": 4}, vcpus=64)
    assert shown["limits"]["gpus"] == 8 and shown["limits"]["gpus_by_type"] == {A6000: 4}
    # A project's: the account's owner or admin, within the account's limits.
    project = alice.default_project_id
    with pytest.raises(ValidationFailed) as over:
        limit(ctx, alice, alice, project, vcpus=65)
    assert over.value.field == "vcpus" and over.value.details["account_limit"] == 64
    with pytest.raises(ValidationFailed) as over_type:
        limit(ctx, alice, alice, project, gpus_by_type={A6000: 5})
    assert over_type.value.field == f"gpus_by_type.{A6000}"
    with pytest.raises(ValidationFailed) as negative:
        limit(ctx, alice, alice, project, volume_gb=-1)
    assert negative.value.field == "volume_gb"
    with pytest.raises(ValidationFailed) as unknown:
        limit(ctx, operator, alice, gpus_by_type={"TPU": 1})
    assert unknown.value.field == "gpus_by_type.TPU"
    limit(ctx, alice, alice, project, vcpus=32, running_clusters=2)
    member = Principal(**{**alice.__dict__, "role": Role.MEMBER})
    with pytest.raises(Forbidden):
        limit(ctx, member, alice, project, vcpus=1)
    # null removes a limit, an absent field keeps it.
    limit(ctx, operator, alice, gpus=None)
    view = quotas.show_quotas(ctx, alice, alice.account_id)
    assert view["account"]["limits"] == {
        "gpus": None,
        "gpus_by_type": {A6000: 4},
        "vcpus": 64,
        "volume_gb": None,
        "snapshot_gb": None,
        "running_clusters": None,
    }
    assert view["projects"][0]["limits"]["vcpus"] == 32
    with ctx.read() as session:
        rows = session.scalar(select(func.count()).select_from(Quota))
        events = list(
            session.scalars(
                select(AuditEvent).where(AuditEvent.action == "quota.set").order_by(AuditEvent.id)
            )
        )
    assert rows == 4  # account: A6000, vcpus; project: vcpus, running_clusters
    assert len(events) == 3
    last = events[-1].detail
    assert last["before"]["gpus"] == 8 and last["after"]["gpus"] is None


def test_usage_counts_what_holds(
    ctx: Context, alice: Principal, operator: Principal, rec: Reconciler
) -> None:
    a = uc.create_cluster(ctx, alice, gpus(2, volume_gb=10))
    b = uc.create_cluster(ctx, alice, gpus(1, volume_gb=5))
    settle(rec, a.id)
    uc.stop_cluster(ctx, alice, a.id)
    settle(rec, a.id)
    uc.terminate_cluster(ctx, alice, b.id)
    with ctx.read() as session:
        usage = quotas.usage_of(session, alice.account_id)
    # The stopped cluster keeps its volume only; the terminating one nothing.
    assert usage.as_dict() == {
        "gpus": 0,
        "gpus_by_type": {},
        "vcpus": 0,
        "volume_gb": 10,
        "snapshot_gb": 0,
        "running_clusters": 0,
    }


def test_new_principal_helper_account_is_separate(ctx: Context) -> None:
    carol = new_principal(ctx, "carol@example.com")
    with ctx.read() as session:
        assert quotas.usage_of(session, carol.account_id).gpus == 0


def test_training_create_and_scale(ctx: Context, alice: Principal, operator: Principal) -> None:
    with ctx.transaction() as s:
        key = add_key(s, alice.account_id, "k1", KEY).id
        image = s.scalar(select(ImageVersion.id).order_by(ImageVersion.id))
    scope = training.Scope(project_id=alice.default_project_id, location="local")

    def spec(workers: int, name: str) -> dict[str, Any]:
        return {
            "name": name,
            "image_version_id": image,
            "ssh_key_ids": [key],
            "no_of_nodes": workers,
            "gpu_type": A6000,
            "gpus_per_node": 2,
            "cpus_per_node": 4,
            "memory_gb_per_node": 8,
        }

    limit(ctx, operator, alice, gpus=6, running_clusters=1)
    with pytest.raises(QuotaExceeded) as too_big:
        training.create_cluster(ctx, alice, scope, spec(4, "big"))
    assert too_big.value.details["resource"] == "gpus"
    assert too_big.value.details["asked"] == 8 and too_big.value.details["in_use"] == 0
    with ctx.read() as session:
        assert session.scalar(select(func.count()).select_from(GpuAllocation)) == 0
    cid = training.create_cluster(ctx, alice, scope, spec(2, "t"))
    with ctx.read() as session:
        usage = quotas.usage_of(session, alice.account_id)
    # Two workers' GPUs and vCPUs, and the controller's vCPUs.
    assert usage.gpus == 4 and usage.running_clusters == 1
    assert usage.vcpus == 8 + CONTROLLER_VCPUS
    with pytest.raises(QuotaExceeded) as second:
        training.create_cluster(ctx, alice, scope, spec(1, "u"))
    assert second.value.details["resource"] == "running_clusters"
    # A scale past the GPU limit is refused; within it, it goes ahead.
    ops = TrainingOperator(ctx, FakeNodeRuntime(), FakeEdge(), drain_timeout_s=0)
    ops.run(cid)
    with pytest.raises(QuotaExceeded) as scaled:
        training.perform_action(
            ctx, alice, scope, cid, {"action": "scale_cluster", "additional_nodes": 2}
        )
    assert scaled.value.details["asked"] == 4 and scaled.value.details["in_use"] == 4
    training.perform_action(
        ctx, alice, scope, cid, {"action": "scale_cluster", "additional_nodes": 1}
    )
    with ctx.read() as session:
        assert quotas.usage_of(session, alice.account_id).gpus == 6
