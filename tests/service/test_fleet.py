"""A fleet of hosts, each with its own (in-memory) engine: clusters run on their host's
engine, an unreachable host keeps its clusters' GPUs and pauses their billing, a
stopped cluster whose host is full resumes on another host with its volume, and a
drained host is emptied. Real database (SQLite and PostgreSQL), fake engines."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from gpuyard.api.rest.schemas.cluster_json import cluster_v1
from gpuyard.core.errors import HostUnreachable, InsufficientCapacity
from gpuyard.reconciler.loop import Reconciler
from gpuyard.reconciler.wiring import build_reconciler
from gpuyard.runtimes.base import ContainerState
from gpuyard.runtimes.fleet import Fleet, HostEngine
from gpuyard.services.clock import FakeClock
from gpuyard.services.clusters import use_cases as uc
from gpuyard.services.clusters import views as cluster_views
from gpuyard.services.clusters.moves import drain_host
from gpuyard.services.clusters.requests import StartCluster
from gpuyard.services.context import Context
from gpuyard.services.tenancy.auth import Principal
from gpuyard.store.schema import Cluster, Event, Host, UsageInterval, VolumeMove
from gpuyard.testing.fake_runtime import FakeRuntime
from tests.conftest import new_operator
from tests.helpers import add_host_row, assert_totals_match_history
from tests.service.test_lifecycle import a6000, gpus_held


class Engines:
    """One fake engine per host; the local host's is ``local``."""

    def __init__(self) -> None:
        self.local = FakeRuntime()
        self.by_host: dict[int, FakeRuntime] = {}

    def make(self, host: HostEngine) -> FakeRuntime:
        return self.by_host.setdefault(host.host_id, FakeRuntime())

    def of(self, ctx: Context, host_id: int) -> FakeRuntime:
        with ctx.read() as s:
            host = s.get(Host, host_id)
            assert host is not None
            local = host.is_local
        return self.local if local else self.by_host[host_id]


@pytest.fixture
def engines() -> Engines:
    return Engines()


@pytest.fixture
def fleet_rec(ctx: Context, engines: Engines) -> Reconciler:
    return build_reconciler(ctx, Fleet(engines.local, engines.make))


def settle(rec: Reconciler, cid: str) -> None:
    for _ in range(6):
        rec.driver.drive(cid)


def host_of(ctx: Context, cid: str) -> int:
    with ctx.read() as s:
        row = s.get(Cluster, cid)
        assert row is not None and row.host_id is not None
        return row.host_id


def events(ctx: Context, cid: str) -> list[str]:
    with ctx.read() as s:
        return list(s.scalars(select(Event.message).where(Event.cluster_id == cid)))


def local_host(ctx: Context) -> int:
    with ctx.read() as s:
        found = s.scalar(select(Host.id).where(Host.is_local.is_(True)))
        assert found is not None
        return found


def test_clusters_run_on_their_hosts_engine(
    ctx: Context, alice: Principal, fleet_rec: Reconciler, engines: Engines
) -> None:
    h2 = add_host_row(ctx, "h2", 2)
    # Best fit: the 2-GPU host is left with none free, the local one keeps its 4.
    c = uc.create_cluster(ctx, alice, a6000(2, volume_gb=5))
    assert c.host_id == h2
    settle(fleet_rec, c.id)
    assert engines.by_host[h2].containers[c.id].state == ContainerState.RUNNING
    assert c.id not in engines.local.containers


def test_stopped_cluster_resumes_on_another_host_with_its_volume(
    ctx: Context, alice: Principal, fleet_rec: Reconciler, engines: Engines
) -> None:
    h2 = add_host_row(ctx, "h2", 2)
    c = uc.create_cluster(ctx, alice, a6000(2, volume_gb=5, env={"A": "1"}))
    settle(fleet_rec, c.id)
    old = engines.by_host[h2]
    old.write_file(c.id, "/workspace/ckpt", "epoch-7")
    old.write_file(c.id, "/workspace/data/x", "y" * 1000)
    uc.stop_cluster(ctx, alice, c.id)
    settle(fleet_rec, c.id)
    filler = uc.create_cluster(ctx, alice, a6000(2))  # takes h2's two GPUs
    assert filler.host_id == h2

    with pytest.raises(InsufficientCapacity):
        uc.start_cluster(ctx, alice, c.id, StartCluster(allow_move=False))
    row = uc.get_cluster(ctx, alice, c.id)
    assert row.status == "stopped" and row.host_id == h2
    with ctx.read() as s:
        assert s.get(VolumeMove, c.id) is None

    started = uc.start_cluster(ctx, alice, c.id, StartCluster())
    local = local_host(ctx)
    assert started.cluster.host_id == local and started.cluster.status == "starting"
    # Until the copy is done, the start's progress says the volume is moving.
    [shown] = cluster_views.details(ctx, [uc.get_cluster(ctx, alice, c.id)])
    progress = cluster_v1(shown)["startup_progress"]
    assert progress["current_step"] == "Moving volume"
    assert progress["moving_volume"]["from_host_id"] == h2
    assert progress["moving_volume"]["to_host_id"] == local
    settle(fleet_rec, c.id)
    row = uc.get_cluster(ctx, alice, c.id)
    assert row.status == "running" and row.host_id == local and row.id == c.id
    volume = ctx.ownership.volume(c.id)
    assert engines.local.volume_files(volume) == {"ckpt": "epoch-7", "data/x": "y" * 1000}
    assert engines.local.containers[c.id].spec.env["A"] == "1"
    assert volume not in old.volumes  # the old copy goes once the new one runs
    with ctx.read() as s:
        move = s.get(VolumeMove, c.id)
        assert move is not None and move.status == "done" and move.bytes_copied == 1007
    said = events(ctx, c.id)
    assert any("volume moved from host h2" in m and "1007 bytes" in m for m in said)


def test_unreachable_host_keeps_gpus_pauses_billing_and_converges(
    ctx: Context, alice: Principal, fleet_rec: Reconciler, engines: Engines, clock: FakeClock
) -> None:
    h2 = add_host_row(ctx, "h2", 4)
    c = uc.create_cluster(ctx, alice, a6000(4, volume_gb=5))
    resting = uc.create_cluster(ctx, alice, a6000(2, volume_gb=5))
    assert c.host_id == h2 and resting.host_id != h2
    settle(fleet_rec, c.id)
    clock.advance(30)
    fleet_rec.heartbeat_now()
    answered_at = clock.now()
    remote = engines.by_host[h2]
    remote.unavailable = "connection refused"
    for _ in range(ctx.settings.heartbeat_misses):
        clock.advance(5)
        fleet_rec.heartbeat_now()
    with ctx.read() as s:
        host = s.get(Host, h2)
        assert host is not None and not host.healthy and host.unreachable_since is not None
        open_rows = list(
            s.scalars(
                select(UsageInterval).where(
                    UsageInterval.cluster_id == c.id, UsageInterval.ended_at.is_(None)
                )
            )
        )
        assert open_rows == []  # billing paused...
        ends = set(
            s.scalars(select(UsageInterval.ended_at).where(UsageInterval.cluster_id == c.id))
        )
        assert ends == {answered_at.replace(microsecond=0)}  # ...from the last answer
    assert_totals_match_history(ctx, c.id)
    assert gpus_held(ctx, c.id) == [0, 1, 2, 3]
    assert any("unreachable" in m for m in events(ctx, c.id))
    ctx.references.invalidate()
    details = uc.get_cluster(ctx, alice, c.id)
    assert details.status == "running"
    # New work goes elsewhere.
    other = uc.create_cluster(ctx, alice, a6000(1))
    assert other.host_id != h2

    # The host's engine lost the container meanwhile; once it answers, it converges.
    remote.containers.pop(c.id)
    remote.unavailable = None
    clock.advance(60)
    fleet_rec.heartbeat_now()
    with ctx.read() as s:
        host = s.get(Host, h2)
        assert host is not None and host.healthy and host.unreachable_since is None
        reopened = s.scalar(
            select(UsageInterval.started_at).where(
                UsageInterval.cluster_id == c.id, UsageInterval.ended_at.is_(None)
            )
        )
        assert reopened == clock.now().replace(microsecond=0)
    clock.advance(7)
    assert_totals_match_history(ctx, c.id)
    for _ in range(50):
        fleet_rec.driver.recover(c.id)
        clock.advance(2)
        if c.id in remote.containers and remote.containers[c.id].state == ContainerState.RUNNING:
            break
    assert remote.containers[c.id].state == ContainerState.RUNNING


def test_stopped_cluster_on_unreachable_host_answers_host_unreachable(
    ctx: Context, alice: Principal, fleet_rec: Reconciler, engines: Engines, clock: FakeClock
) -> None:
    h2 = add_host_row(ctx, "h2", 2)
    c = uc.create_cluster(ctx, alice, a6000(2, volume_gb=5))
    settle(fleet_rec, c.id)
    uc.stop_cluster(ctx, alice, c.id)
    settle(fleet_rec, c.id)
    fleet_rec.heartbeat_now()
    engines.by_host[h2].unavailable = "no route to host"
    for _ in range(ctx.settings.heartbeat_misses):
        clock.advance(5)
        fleet_rec.heartbeat_now()
    with pytest.raises(HostUnreachable) as caught:
        uc.start_cluster(ctx, alice, c.id, StartCluster())
    assert caught.value.details and caught.value.details["host_id"] == h2
    row = uc.get_cluster(ctx, alice, c.id)
    assert row.status == "stopped" and row.host_id == h2


def test_drain_moves_running_and_stopped_clusters_away(
    ctx: Context, alice: Principal, fleet_rec: Reconciler, engines: Engines
) -> None:
    h2 = add_host_row(ctx, "h2", 2)
    running = uc.create_cluster(ctx, alice, a6000(1, volume_gb=5))
    resting = uc.create_cluster(ctx, alice, a6000(1, volume_gb=5))
    assert running.host_id == h2 and resting.host_id == h2
    settle(fleet_rec, running.id)
    settle(fleet_rec, resting.id)
    remote = engines.by_host[h2]
    remote.write_file(running.id, "/workspace/a", "running-data")
    remote.write_file(resting.id, "/workspace/b", "resting-data")
    uc.stop_cluster(ctx, alice, resting.id)
    settle(fleet_rec, resting.id)

    report = drain_host(ctx, new_operator(ctx), h2)
    assert report.stopping == [running.id] and report.moving == [resting.id]
    assert report.cannot_move == []
    for _ in range(5):
        fleet_rec.run_pass(observe=False)
        fleet_rec.wait_idle(10)
        fleet_rec.heartbeat_now()
        fleet_rec.wait_idle(10)
        settle(fleet_rec, running.id)
    local = local_host(ctx)
    moved = uc.get_cluster(ctx, alice, running.id)
    assert moved.status == "running" and moved.host_id == local
    kept = uc.get_cluster(ctx, alice, resting.id)
    assert kept.status == "stopped" and kept.host_id == local
    assert engines.local.volume_files(ctx.ownership.volume(running.id)) == {"a": "running-data"}
    assert engines.local.volume_files(ctx.ownership.volume(resting.id)) == {"b": "resting-data"}
    assert remote.volumes == {} and not any(
        c.state == ContainerState.RUNNING for c in remote.containers.values()
    )
    with ctx.read() as s:
        host = s.get(Host, h2)
        assert host is not None and host.status == "draining"
        assert host_of(ctx, running.id) == local
