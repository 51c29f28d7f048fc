"""A start asks the host which ports are taken from the moment it begins (its store
reads and spec go on meanwhile), the container's create takes that answer, and
still never starts a container on a port something else holds: a port gpuyard chose
that turns out taken gets the container made again on a free one before the start; a
port the user chose is asked about first (no container is made for a start that
fails). Another installation's container on the same engine counts like any process.
Fake runtime (events make the two calls meet, no clock), real database."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from gpuyard.core.ownership import Ownership
from gpuyard.reconciler.loop import Reconciler
from gpuyard.runtimes.base import ContainerSpec, PortBinding
from gpuyard.services.clusters import use_cases as uc
from gpuyard.services.context import Context
from gpuyard.services.tenancy.auth import Principal
from gpuyard.testing.fake_runtime import FakeRuntime
from tests.service.test_lifecycle import a6000, settle, status
from tests.service.test_port_moves import HTTP, events, host_ports

MEET_S = 10.0  # only a guard against a hang: the two calls meet at once when side by side


class MeetingRuntime(FakeRuntime):
    """A fake whose create and host-port question each wait for the other to have
    begun: they only both return if they run at the same time."""

    def __init__(self) -> None:
        super().__init__()
        self.creating = threading.Event()
        self.asking = threading.Event()
        self.met: list[bool] = []
        self.started_ports: list[tuple[int, ...]] = []
        self.after_create: Callable[[], None] | None = None

    def create(self, spec: ContainerSpec) -> str:
        if not self.creating.is_set():
            self.creating.set()
            self.met.append(self.asking.wait(MEET_S))
        made = super().create(spec)
        if self.after_create is not None:
            self.after_create()
        return made

    def host_ports_in_use(self, low: int, high: int, cluster_id: str) -> frozenset[tuple[int, str]]:
        if not self.asking.is_set():
            self.asking.set()
            self.met.append(self.creating.wait(MEET_S))
        return super().host_ports_in_use(low, high, cluster_id)

    def start(self, cluster_id: str) -> None:
        with self._lock:
            ports = tuple(p.external_port for p in self.containers[cluster_id].spec.ports)
        self.started_ports.append(ports)
        super().start(cluster_id)


@pytest.fixture
def runtime() -> MeetingRuntime:
    return MeetingRuntime()


def test_the_host_is_asked_while_the_container_is_created(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: MeetingRuntime
) -> None:
    c = uc.create_cluster(ctx, alice, a6000(1, ports=HTTP))
    settle(rec, c.id)
    assert status(ctx, alice, c.id) == "running"
    assert runtime.met == [True, True]
    assert runtime.calls["create"] == 1
    assert runtime.calls["host_ports_in_use"] == 1  # the start's early ask, taken


def test_a_taken_port_found_meanwhile_is_never_started_on(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: MeetingRuntime
) -> None:
    low = ctx.settings.port_range_start
    runtime.listening.add((low, "tcp"))
    c = uc.create_cluster(ctx, alice, a6000(1, ports=HTTP))
    settle(rec, c.id)
    assert status(ctx, alice, c.id) == "running"
    assert host_ports(ctx, c.id) == ([low + 1], [low + 1])
    # Made on the taken port while the host was asked, made again on the free one,
    # and only that one started.
    assert runtime.calls["create"] == 2
    assert runtime.started_ports == [(low + 1,)]
    assert events(ctx, c.id, "start_retry") == []


def test_another_installations_port_is_never_started_on(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: MeetingRuntime
) -> None:
    low = ctx.settings.port_range_start
    neighbour = runtime.sharing_engine()  # a second installation on the same engine
    neighbour.bind(Ownership.new())
    neighbour.images.add("img")
    theirs = ContainerSpec(
        cluster_id="theirs",
        image="img",
        command=None,
        env={},
        ports=(PortBinding(80, low, "tcp"),),
        volume_name=None,
        volume_mount_path="/workspace",
        cpu_cores=0,
        memory_gb=0,
        gpu_indices=(),
    )
    neighbour.create(theirs)
    neighbour.start("theirs")
    runtime.started_ports.clear()
    c = uc.create_cluster(ctx, alice, a6000(1, ports=HTTP))
    settle(rec, c.id)
    assert status(ctx, alice, c.id) == "running"
    assert host_ports(ctx, c.id) == ([low + 1], [low + 1])
    assert runtime.started_ports == [(low + 1,)]
    assert runtime.containers["theirs"].spec.ports[0].external_port == low  # left alone


def test_a_port_the_user_chose_is_asked_about_before_any_container(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: MeetingRuntime
) -> None:
    chosen = ctx.settings.port_range_start + 7
    runtime.listening.add((chosen, "tcp"))
    # The first create and question would wait for each other in vain: release both.
    runtime.creating.set()
    runtime.asking.set()
    c = uc.create_cluster(
        ctx, alice, a6000(1, ports=[{"internal_port": 22, "external_port": chosen}])
    )
    rec.driver.drive(c.id)
    view = uc.get_cluster(ctx, alice, c.id)
    assert view.status == "error"
    assert f"host port {chosen}/tcp" in (view.error_message or "")
    assert runtime.calls.get("create", 0) == 0
    assert runtime.started_ports == []


def test_a_cluster_that_moves_on_while_its_container_starts_is_not_left_running(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: MeetingRuntime
) -> None:
    runtime.creating.set()
    runtime.asking.set()
    c = uc.create_cluster(ctx, alice, a6000(1))
    # Terminated once its container is made: the start's record of the container
    # finds the cluster moved on, while the engine starts the container.
    runtime.after_create = lambda: uc.terminate_cluster(ctx, alice, c.id)
    rec.driver.drive(c.id)
    assert runtime.started_ports == [()]
    assert c.id not in runtime.containers  # stopped at once, not left for the next pass
    settle(rec, c.id)
    assert status(ctx, alice, c.id) == "terminated"
