"""What a member opened stops when the membership ends or narrows, over real HTTP
(fake runtime, a fake shell): an open web terminal is closed (4403), a log follow
ends with ``end {"status":"access_ended"}``, and a console session stops acting.
Every wait polls a condition with a generous bound; nothing sleeps a fixed time."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import websockets
from websockets.exceptions import ConnectionClosed

from gpuyard.core.tls_trust import trusted_tls
from gpuyard.services.tenancy import members
from gpuyard.services.tenancy.auth import resolve_key
from tests.api.sse import events
from tests.api.test_terminal_api import A6000, FakeShell, eventually, running_cluster, ws_url
from tests.api.test_terminal_api import shells as shells
from tests.helpers import LiveServer

WAIT_S = 30.0


@dataclass
class Member:
    key: str
    id: int
    account_id: int


@pytest.fixture
def member(srv: LiveServer) -> Member:
    """A user invited into the operator's account as a ``member``, with their key."""
    ctx = srv.server.ctx
    with ctx.read() as session:
        owner = resolve_key(session, srv.key)
    inv = members.create_invitation(
        ctx, owner, owner.account_id, "carol@example.com", "member", None
    )
    made = members.accept_invitation(ctx, inv.token, name=None, caller=None)
    return Member(made["api_key"]["key"], made["membership"]["id"], owner.account_id)


def remove(srv: LiveServer, who: Member) -> None:
    with srv.client() as c:
        r = c.delete(f"/v1/accounts/{who.account_id}/members/{who.id}")
        assert r.status_code == 200, r.text


def demote(srv: LiveServer, who: Member, role: str) -> None:
    with srv.client() as c:
        r = c.patch(f"/v1/accounts/{who.account_id}/members/{who.id}", json={"role": role})
        assert r.status_code == 200, r.text


def terminal_close(srv: LiveServer, cid: str, key: str, end: Any) -> tuple[int | None, str]:
    """Open a terminal with ``key``, call ``end()`` once the shell answered, and wait
    (bounded) for the server to close it: its close code and reason."""

    async def go() -> tuple[int | None, str]:
        async with websockets.connect(
            ws_url(srv, cid), additional_headers={"Authorization": f"Bearer {key}"}
        ) as ws:
            assert await ws.recv() == b"$ "
            await asyncio.to_thread(end)
            with pytest.raises(ConnectionClosed):
                while True:
                    await asyncio.wait_for(ws.recv(), WAIT_S)
            return ws.close_code, ws.close_reason or ""

    return asyncio.run(go())


def test_a_removed_members_terminal_is_closed(
    srv: LiveServer, shells: list[tuple[str, FakeShell]], member: Member
) -> None:
    cid = running_cluster(srv)
    code, reason = terminal_close(srv, cid, member.key, lambda: remove(srv, member))
    assert code == 4403 and "access ended" in reason
    eventually(lambda: all(shell.closed for _, shell in shells))


def test_a_member_demoted_to_viewer_loses_the_terminal(
    srv: LiveServer, shells: list[tuple[str, FakeShell]], member: Member
) -> None:
    cid = running_cluster(srv)
    code, _ = terminal_close(srv, cid, member.key, lambda: demote(srv, member, "viewer"))
    assert code == 4403


def test_a_removed_members_log_follow_ends(srv: LiveServer, member: Member) -> None:
    cid = running_cluster(srv)
    with (
        httpx.Client(
            base_url=srv.url,
            headers={"Authorization": f"Bearer {member.key}"},
            timeout=WAIT_S,
            verify=trusted_tls(),
        ) as c,
        c.stream("GET", f"/v1/clusters/{cid}/logs", params={"follow": "true", "tail": 1}) as r,
    ):
        assert r.status_code == 200, r.read()
        stream = events(r)
        next(stream)  # the first page came: the follow is open
        remove(srv, member)
        # The stream ends by itself (a read timeout would fail the test).
        last = list(stream)[-1]
    assert (last.event, last.json) == ("end", {"status": "access_ended"})


def test_a_removed_members_console_session_stops_acting(srv: LiveServer, member: Member) -> None:
    with httpx.Client(base_url=srv.url, timeout=WAIT_S, verify=trusted_tls()) as page:
        r = page.post("/v1/console/session", json={"api_key": member.key})
        assert r.status_code == 201, r.text
        headers = {"X-CSRF-Token": r.json()["data"]["csrf_token"]}
        assert page.get("/v1/clusters", headers=headers).status_code == 200
        remove(srv, member)
        eventually(lambda: page.get("/v1/clusters", headers=headers).status_code == 401, WAIT_S)
        # Nothing written on the member's behalf either.
        body = {"gpu_type": A6000, "gpu_count": 1, "docker_image": "img"}
        assert page.post("/v1/clusters", json=body, headers=headers).status_code == 401
