"""A port is never handed to a container while something else on the host holds it:
the start asks the host and moves a port gpuyard chose to a free one (an event names
the old and the new port), moves on again when the engine still meets "address already
in use", and fails at once with PORT_IN_USE for a port the user chose. Fake runtime
(its ``listening``/``hidden`` host ports), real database, injected clock."""

from __future__ import annotations

from sqlalchemy import select

from gpuyard.reconciler.clusters.port_moves import port_in_use
from gpuyard.reconciler.loop import Reconciler
from gpuyard.services.clock import FakeClock
from gpuyard.services.clusters import use_cases as uc
from gpuyard.services.context import Context
from gpuyard.services.tenancy.auth import Principal
from gpuyard.store.schema import Cluster, Event, PortAllocation
from gpuyard.testing.fake_runtime import FakeRuntime
from tests.service.test_lifecycle import a6000, settle, status

HTTP = [{"internal_port": 8888, "protocol": "http"}]


def events(ctx: Context, cid: str, kind: str) -> list[str]:
    with ctx.read() as s:
        return list(
            s.scalars(select(Event.message).where(Event.cluster_id == cid, Event.type == kind))
        )


def host_ports(ctx: Context, cid: str) -> tuple[list[int], list[int]]:
    """(the claims, the ports the cluster's network shows)."""
    with ctx.read() as s:
        claims = sorted(
            s.scalars(select(PortAllocation.port).where(PortAllocation.cluster_id == cid))
        )
        shown = [
            p["host_port"] for p in s.scalars(select(Cluster.ports).where(Cluster.id == cid)).one()
        ]
    return claims, shown


def test_a_port_a_process_holds_is_never_handed_out(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime
) -> None:
    low = ctx.settings.port_range_start
    runtime.listening.add((low, "tcp"))
    c = uc.create_cluster(ctx, alice, a6000(1, ports=HTTP))
    settle(rec, c.id)
    assert status(ctx, alice, c.id) == "running"
    assert host_ports(ctx, c.id) == ([low + 1], [low + 1])
    assert events(ctx, c.id, "port_moved") == [
        f"host port {low}/tcp is in use on the host; port 8888/tcp got host port {low + 1} instead"
    ]
    assert events(ctx, c.id, "start_retry") == []


def test_a_start_that_meets_address_in_use_moves_on(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime
) -> None:
    low = ctx.settings.port_range_start
    runtime.hidden.update({(low, "tcp"), (low + 1, "tcp")})  # bound after the host was asked
    c = uc.create_cluster(ctx, alice, a6000(1, ports=HTTP))
    settle(rec, c.id)
    assert status(ctx, alice, c.id) == "running"
    assert host_ports(ctx, c.id) == ([low + 2], [low + 2])
    assert len(events(ctx, c.id, "port_moved")) == 2
    assert events(ctx, c.id, "start_retry") == []


def test_a_port_the_user_chose_that_is_taken_fails_at_once(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime
) -> None:
    chosen = ctx.settings.port_range_start + 7
    runtime.listening.add((chosen, "tcp"))
    c = uc.create_cluster(
        ctx, alice, a6000(1, ports=[{"internal_port": 22, "external_port": chosen}])
    )
    rec.driver.drive(c.id)
    view = uc.get_cluster(ctx, alice, c.id)
    assert view.status == "error"
    assert f"host port {chosen}/tcp" in (view.error_message or "")
    assert events(ctx, c.id, "start_retry") == []
    assert runtime.calls.get("create", 0) == 0


def test_the_engines_words_name_the_port() -> None:
    podman = "cannot listen on the TCP port: listen tcp4 :20000: bind: address already in use"
    assert port_in_use(podman) == (20000, "tcp")
    assert port_in_use("listen udp 0.0.0.0:20003: bind: address already in use") == (
        20003,
        "udp",
    )
    assert port_in_use("Bind for 0.0.0.0:20001 failed: port is already allocated") == (
        20001,
        "tcp",
    )
    assert port_in_use("database is locked") is None


def test_a_restart_after_a_crash_moves_off_a_port_taken_meanwhile(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime, clock: FakeClock
) -> None:
    low = ctx.settings.port_range_start
    c = uc.create_cluster(ctx, alice, a6000(1, ports=HTTP))
    settle(rec, c.id)
    assert host_ports(ctx, c.id) == ([low], [low])
    runtime.crash(c.id, exit_code=1)
    rec.driver.recover(c.id)  # counted; the restart is due after the back-off
    runtime.listening.add((low, "tcp"))  # a program took the port meanwhile
    clock.advance(60)
    rec.driver.recover(c.id)
    assert status(ctx, alice, c.id) == "running"
    assert runtime.containers[c.id].state.value == "running"
    assert host_ports(ctx, c.id) == ([low + 1], [low + 1])
    assert len(events(ctx, c.id, "port_moved")) == 1
