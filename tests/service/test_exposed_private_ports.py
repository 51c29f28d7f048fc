"""A private http port stays private on every host a cluster can be placed on: a host
whose engine is reached over tcp:// gives the proxy no way to a port on its loopback, so
a cluster with a private http port is refused there (nothing stored) unless the
operator allows it; public and tcp ports are placed there as before."""

from __future__ import annotations

import pytest
from sqlalchemy import update

from gpuyard.core.errors import PrivatePortsExposed
from gpuyard.services.clusters import use_cases as uc
from gpuyard.services.context import Context
from gpuyard.services.tenancy.auth import Principal
from gpuyard.store.schema import Host
from tests.helpers import add_host_row
from tests.service.test_lifecycle import a6000


def _tcp_host(ctx: Context) -> int:
    """A 2-GPU host reached over tcp://: best fit places a 2-GPU cluster there."""
    host_id = add_host_row(ctx, "t1", 2)
    with ctx.transaction() as s:
        s.execute(update(Host).where(Host.id == host_id).values(engine_url="tcp://t1.example:2375"))
    return host_id


def _port(visibility: str, protocol: str = "http") -> dict[str, object]:
    return {"internal_port": 8888, "protocol": protocol, "visibility": visibility}


def test_a_private_http_port_is_refused_on_a_tcp_host(ctx: Context, alice: Principal) -> None:
    _tcp_host(ctx)
    ctx.settings.allow_exposed_private_ports = False
    with pytest.raises(PrivatePortsExposed) as refused:
        uc.create_cluster(ctx, alice, a6000(2, ports=[_port("private")]))
    assert refused.value.http_status == 409
    assert refused.value.details == {"host_id": refused.value.details["host_id"], "ports": [8888]}
    assert "GPUYARD_ALLOW_EXPOSED_PRIVATE_PORTS" in refused.value.message
    assert uc.list_clusters(ctx, alice).total == 0  # nothing stored, no GPU held


@pytest.mark.parametrize("port", [_port("public"), _port("private", "tcp")])
def test_public_and_tcp_ports_are_placed_there(
    ctx: Context, alice: Principal, port: dict[str, object]
) -> None:
    host_id = _tcp_host(ctx)
    ctx.settings.allow_exposed_private_ports = False
    assert uc.create_cluster(ctx, alice, a6000(2, ports=[port])).host_id == host_id


def test_the_operator_may_allow_it(ctx: Context, alice: Principal) -> None:
    host_id = _tcp_host(ctx)
    ctx.settings.allow_exposed_private_ports = True
    c = uc.create_cluster(ctx, alice, a6000(2, ports=[_port("private")]))
    assert c.host_id == host_id


def test_an_ssh_host_keeps_private_ports(ctx: Context, alice: Principal) -> None:
    host_id = add_host_row(ctx, "s1", 2)  # ssh://: the proxy reaches its loopback
    ctx.settings.allow_exposed_private_ports = False
    c = uc.create_cluster(ctx, alice, a6000(2, ports=[_port("private")]))
    assert c.host_id == host_id
