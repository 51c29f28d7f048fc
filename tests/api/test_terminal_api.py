"""``/v1/clusters/{id}/terminal`` on the real app over real HTTP (fake runtime, a fake
shell injected as ``app.state.terminal_opener``): who is refused before the upgrade and
how, the key forms (header, query, subprotocol), the protocol (bytes, resize, exit,
errors), close reasons, and the events a session leaves. The real shell on real Podman
is tests/e2e/test_terminal_e2e.py."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import websockets
from websockets.exceptions import ConnectionClosed, InvalidStatus

from gpuyard.core.tls_trust import trusted_tls
from gpuyard.edge.terminal_bridge import Resize
from gpuyard.runtimes.base import Runtime
from gpuyard.services.tenancy.auth import Scope, create_account, issue_key
from tests.helpers import LiveServer

A6000 = "NVIDIA RTX A6000"


class FakeShell:
    """Echoes each input line; ``exit N`` ends it with code N."""

    def __init__(self, size: Resize) -> None:
        self.sizes = [(size.rows, size.cols)]
        self.out: asyncio.Queue[bytes] = asyncio.Queue()
        self.code = -1
        self.closed = False
        self.out.put_nowait(b"$ ")

    async def read(self) -> bytes:
        return await self.out.get()

    async def write(self, data: bytes) -> None:
        for line in data.decode().splitlines():
            if line.startswith("exit "):
                self.code = int(line.split()[1])
                self.out.put_nowait(b"")
            else:
                self.out.put_nowait(line.encode() + b"\r\n")

    async def resize(self, rows: int, cols: int) -> bool:
        self.sizes.append((rows, cols))
        self.out.put_nowait(f"size {rows}x{cols}\r\n".encode())
        return True

    async def wait(self, timeout_s: float = 10.0) -> int:
        return self.code

    async def close(self) -> None:
        self.closed = True
        self.out.put_nowait(b"")


@pytest.fixture
def shells(srv: LiveServer) -> list[tuple[str, FakeShell]]:
    made: list[tuple[str, FakeShell]] = []

    async def opener(runtime: Runtime, container: str, size: Resize) -> FakeShell:
        shell = FakeShell(size)
        made.append((container, shell))
        return shell

    srv.server.app.state.terminal_opener = opener
    return made


def running_cluster(srv: LiveServer, key: str | None = None) -> str:
    with srv.client(key) as c:
        r = c.post("/v1/clusters", json={"gpu_type": A6000, "gpu_count": 1, "docker_image": "img"})
        assert r.status_code == 201, r.text
        cid: str = r.json()["data"]["id"]
        assert srv.server.reconciler.wait_idle(10)
        assert c.get(f"/v1/clusters/{cid}").json()["data"]["status"] == "running"
    return cid


def ws_url(srv: LiveServer, cid: str, query: str = "") -> str:
    return srv.url.replace("http://", "ws://") + f"/v1/clusters/{cid}/terminal" + query


def new_key(srv: LiveServer, scope: Scope, *, other_account: bool = False) -> str:
    with srv.server.ctx.transaction() as session:
        if other_account:
            user, account, _ = create_account(session, email="b@example.com", name="b")
            uid, aid = user.id, account.id
        else:
            row = session.execute(
                __import__("sqlalchemy").text("select user_id, account_id from api_keys limit 1")
            ).one()
            uid, aid = row[0], row[1]
        return issue_key(session, user_id=uid, account_id=aid, name=f"k-{scope}", scope=scope).key


def refusal(url: str, **kwargs: Any) -> tuple[int, dict[str, Any]]:
    """The HTTP status and JSON body with which the upgrade to ``url`` is refused."""

    async def go() -> tuple[int, dict[str, Any]]:
        with pytest.raises(InvalidStatus) as e:
            async with websockets.connect(url, **kwargs):
                pass
        response = e.value.response
        return response.status_code, json.loads(response.body or b"{}")

    return asyncio.run(go())


def eventually(check: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "not within the time"
        time.sleep(0.02)


def events(srv: LiveServer, cid: str) -> list[dict[str, Any]]:
    with srv.client() as c:
        found: list[dict[str, Any]] = c.get(f"/v1/clusters/{cid}/events").json()["data"]["events"]
    return [e for e in found if e["type"] == "terminal"]


def test_refusals_before_the_upgrade(srv: LiveServer, shells: list[Any]) -> None:
    cid = running_cluster(srv)
    status, body = refusal(ws_url(srv, cid))
    assert status == 401 and body["error"]["code"] == "UNAUTHORIZED"
    status, _ = refusal(ws_url(srv, cid), additional_headers={"Authorization": "Bearer gy_wrong"})
    assert status == 401
    status, _ = refusal(ws_url(srv, cid), subprotocols=["gpuyard.key.gy_wrong"])  # type: ignore[list-item]
    assert status == 401
    read_only = new_key(srv, Scope.READ)
    status, body = refusal(ws_url(srv, cid, f"?api_key={read_only}"))
    assert status == 403 and body["error"]["code"] == "FORBIDDEN"
    # Another account's cluster is no different from a missing one.
    other = new_key(srv, Scope.WRITE, other_account=True)
    status, body = refusal(ws_url(srv, cid), additional_headers={"Authorization": other})
    assert status == 404 and body["error"]["code"] == "CLUSTER_NOT_FOUND"
    status, _ = refusal(
        ws_url(srv, "abcdefghijklmn"), additional_headers={"Authorization": srv.key}
    )
    assert status == 404
    status, body = refusal(
        ws_url(srv, cid, "?rows=0&cols=80"), additional_headers={"Authorization": srv.key}
    )
    assert status == 400 and body["error"]["details"]["field"] == "rows"
    assert shells == [] and events(srv, cid) == []


def test_plain_http_get_is_checked_then_told_to_upgrade(srv: LiveServer) -> None:
    cid = running_cluster(srv)
    with srv.client() as c:
        r = c.get(f"/v1/clusters/{cid}/terminal")
        assert r.status_code == 426 and r.headers["upgrade"] == "websocket"
        assert r.json()["error"]["code"] == "UPGRADE_REQUIRED"
    with srv.client(new_key(srv, Scope.READ)) as c:
        assert c.get(f"/v1/clusters/{cid}/terminal").status_code == 403
    assert (
        httpx.get(f"{srv.url}/v1/clusters/{cid}/terminal", verify=trusted_tls()).status_code == 401
    )


def test_session_over_the_key_subprotocol(srv: LiveServer, shells: list[Any]) -> None:
    cid = running_cluster(srv)

    async def go() -> dict[str, Any]:
        async with websockets.connect(
            ws_url(srv, cid, "?rows=30&cols=100"),
            subprotocols=["gpuyard.terminal.v1", f"gpuyard.key.{srv.key}"],  # type: ignore[list-item]
        ) as ws:
            # The server picks the terminal protocol, never echoes the key.
            assert ws.subprotocol == "gpuyard.terminal.v1"
            assert await ws.recv() == b"$ "
            await ws.send(b"echo hi\n")
            assert await ws.recv() == b"echo hi\r\n"
            await ws.send(json.dumps({"type": "resize", "rows": 50, "cols": 132}))
            assert await ws.recv() == b"size 50x132\r\n"
            await ws.send(json.dumps({"type": "resize", "rows": "x"}))
            error = json.loads(await ws.recv())
            assert error["type"] == "error" and "rows" in error["message"]
            await ws.send("not json")
            assert json.loads(await ws.recv())["type"] == "error"
            await ws.send(b"exit 3\n")
            exit_message = json.loads(await ws.recv())
            with pytest.raises(ConnectionClosed):
                await ws.recv()
            assert ws.close_code == 1000 and "code 3" in (ws.close_reason or "")
            return dict(exit_message)

    assert asyncio.run(go()) == {"type": "exit", "code": 3}
    ((container, shell),) = shells
    assert container.startswith("fake")  # the runtime handle's container id
    assert shell.sizes == [(30, 100), (50, 132)]
    # The server finishes the session (closes the shell, records it) after the client
    # has seen the close.
    eventually(lambda: shell.closed and len(events(srv, cid)) == 2)
    opened, closed = events(srv, cid)
    assert "opened with API key 'admin'" in opened["message"]
    assert closed["message"] == "web terminal closed: the shell exited with code 3"
    assert srv.key not in opened["message"] + closed["message"]


def test_header_and_query_keys_and_a_client_that_leaves(srv: LiveServer, shells: list[Any]) -> None:
    cid = running_cluster(srv)

    async def go() -> None:
        async with websockets.connect(
            ws_url(srv, cid), additional_headers={"Authorization": f"Bearer {srv.key}"}
        ) as ws:
            assert ws.subprotocol is None
            assert await ws.recv() == b"$ "
        async with websockets.connect(ws_url(srv, cid, f"?api_key={srv.key}")) as ws:
            assert await ws.recv() == b"$ "
            await ws.send(b"ls\n")
            assert await ws.recv() == b"ls\r\n"

    asyncio.run(go())
    # The server records the close after the client has gone.
    eventually(lambda: len(events(srv, cid)) == 4)
    messages = [e["message"] for e in events(srv, cid)]
    assert messages.count("web terminal closed: the client left") == 2
    eventually(lambda: all(shell.closed for _, shell in shells))


def test_a_stopped_cluster_is_closed_with_a_reason(srv: LiveServer, shells: list[Any]) -> None:
    cid = running_cluster(srv)
    with srv.client() as c:
        c.post(f"/v1/clusters/{cid}/stop")
    assert srv.server.reconciler.wait_idle(10)

    async def go() -> tuple[int | None, str | None]:
        async with websockets.connect(
            ws_url(srv, cid), additional_headers={"Authorization": srv.key}
        ) as ws:
            with pytest.raises(ConnectionClosed):
                await ws.recv()
            return ws.close_code, ws.close_reason

    code, reason = asyncio.run(go())
    assert code == 4409 and reason == f"cluster {cid} is stopped: start it to open a terminal"
    assert shells == []


@pytest.fixture
def no_opener(srv: LiveServer) -> Iterator[None]:
    # The fake runtime has no engine: the real opener says so.
    srv.server.app.state.terminal_opener = None
    yield


def test_a_runtime_without_an_engine_is_an_internal_close(srv: LiveServer, no_opener: None) -> None:
    cid = running_cluster(srv)

    async def go() -> tuple[int | None, str | None]:
        async with websockets.connect(
            ws_url(srv, cid), additional_headers={"Authorization": srv.key}
        ) as ws:
            with pytest.raises(ConnectionClosed):
                await ws.recv()
            return ws.close_code, ws.close_reason

    code, reason = asyncio.run(go())
    assert code == 1011 and (reason or "").startswith("cannot open a shell:")
