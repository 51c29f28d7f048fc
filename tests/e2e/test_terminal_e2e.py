"""The web terminal on the real server (``gpuyard serve``) and real Podman: a shell with
a PTY in a running cluster's container over ``/v1/clusters/{id}/terminal`` (typing,
resizing, the exit code), a shell the client walks away from, and the session's
events. The protocol's corners are tests/api/test_terminal_api.py's."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest
import websockets
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from gpuyard.core.tls_trust import trusted_tls
from tests.api.sse import Event, events
from tests.e2e.conftest import DEV_IMAGE
from tests.e2e.test_server_e2e import ServerProcess, running_server, sh, wait_status
from tests.required_parts import needs_tools

pytestmark = [
    pytest.mark.e2e,
    needs_tools("podman", how="apt-get install podman runc (bash scripts/setup-system.sh)"),
]


async def read_until(ws: ClientConnection, needle: bytes, timeout_s: float = 15) -> bytes:
    """Terminal output up to and including ``needle``."""
    seen = b""
    async with asyncio.timeout(timeout_s):
        while needle not in seen:
            frame = await ws.recv()
            assert isinstance(frame, bytes), frame
            seen += frame
    return seen


CSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")


def screen_lines(out: bytes) -> list[bytes]:
    """The lines a terminal would show for ``out``: control sequences dropped, and of
    each line only what follows its last carriage return (busybox's line editor
    redraws the line it is editing when typing arrives while it waits for the answer
    to its cursor-position query: ``ech\r/ # ech\x1b[Jo hi``)."""
    return [line.rsplit(b"\r", 1)[-1] for line in CSI.sub(b"", out).split(b"\r\n")]


def test_screen_lines_follow_a_redrawn_line() -> None:
    out = b"/ # \x1b[6nech\r/ # ech\x1b[Jo hi\r\nhi\r\n"
    assert screen_lines(out) == [b"/ # echo hi", b"hi", b""]


def ws_url(server: ServerProcess, cid: str, query: str = "") -> str:
    return server.url.replace("http://", "ws://") + f"/v1/clusters/{cid}/terminal{query}"


def test_terminal_on_a_real_container(
    tmp_path: Path, engine_url: str, engine: docker.DockerClient
) -> None:
    with running_server(tmp_path / "home", engine_url) as server, server.client() as c:
        r = c.post(
            "/v1/clusters",
            json={
                "gpu_type": "NVIDIA RTX A6000",
                "gpu_count": 1,
                "docker_image": DEV_IMAGE,
                "volume_gb": 1,
                "memory_gb": 1,
                "cpu_cores": 1,
            },
        )
        assert r.status_code == 201, r.text
        cid = r.json()["data"]["id"]
        assert wait_status(c, cid, {"running", "error"})["status"] == "running"

        async def session() -> dict[str, Any]:
            async with websockets.connect(
                ws_url(server, cid, "?rows=33&cols=99"),
                subprotocols=["gpuyard.terminal.v1", f"gpuyard.key.{server.key}"],  # type: ignore[list-item]
            ) as ws:
                assert ws.subprotocol == "gpuyard.terminal.v1"
                await ws.send(b"echo hi\n")
                out = await read_until(ws, b"\nhi\r\n")
                # The PTY echoes what is typed.
                assert any(b"echo hi" in line for line in screen_lines(out)), out
                # The first size came with the upgrade; a resize changes it.
                await ws.send(b"busybox stty size\n")
                await read_until(ws, b"33 99\r\n")
                await ws.send(json.dumps({"type": "resize", "rows": 40, "cols": 120}))
                await ws.send(b"busybox stty size\n")
                await read_until(ws, b"40 120\r\n")
                # A tty it is, with TERM set for xterm.js.
                await ws.send(b"test -t 0 && echo tty:$TERM\n")
                await read_until(ws, b"tty:xterm-256color\r\n")
                await ws.send(b"exit 3\n")
                async with asyncio.timeout(15):
                    while True:
                        frame = await ws.recv()
                        if isinstance(frame, str):
                            break
                exit_message: dict[str, Any] = json.loads(frame)
                with pytest.raises(ConnectionClosed):
                    await ws.recv()
                assert ws.close_code == 1000
                return exit_message

        assert asyncio.run(session()) == {"type": "exit", "code": 3}

        # A client that walks away: its shell goes too (the PTY hangs up).
        async def walk_away() -> None:
            async with websockets.connect(
                ws_url(server, cid), additional_headers={"Authorization": f"Bearer {server.key}"}
            ) as ws:
                await ws.send(b"echo $$ > /tmp/shell.pid; echo started\n")
                await read_until(ws, b"\nstarted\r\n")

        asyncio.run(walk_away())
        code, pid = sh(engine, server, cid, "cat /tmp/shell.pid")
        assert code == 0 and pid.strip().isdigit()
        deadline = time.monotonic() + 30
        while sh(engine, server, cid, f"kill -0 {pid.strip()}")[0] == 0:
            assert time.monotonic() < deadline, "the shell outlived its terminal"
            time.sleep(0.1)

        deadline = time.monotonic() + 30
        while True:
            found = c.get(f"/v1/clusters/{cid}/events").json()["data"]["events"]
            messages = [e["message"] for e in found if e["type"] == "terminal"]
            if len(messages) == 4 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        # (A session's close is recorded once it has ended on the server: after the
        # next session may have opened.)
        opened = [m for m in messages if " opened " in m]
        assert len(opened) == 2
        assert all(m.startswith("web terminal opened with API key 'admin' from ") for m in opened)
        assert sorted(m for m in messages if " closed" in m) == [
            "web terminal closed: the client left",
            "web terminal closed: the shell exited with code 3",
        ]
        assert server.key not in server.log.read_text()

        # A stopped cluster: the upgrade happens, the close says why.
        assert c.post(f"/v1/clusters/{cid}/stop").status_code == 200
        wait_status(c, cid, {"stopped"})

        async def stopped() -> tuple[int | None, str | None]:
            async with websockets.connect(ws_url(server, cid, f"?api_key={server.key}")) as ws:
                with pytest.raises(ConnectionClosed):
                    await ws.recv()
                return ws.close_code, ws.close_reason

        code, reason = asyncio.run(stopped())
        assert code == 4409 and "is stopped" in (reason or "")
        assert server.key not in server.log.read_text()


def test_a_removed_members_terminal_and_log_stream_end_within_seconds(
    tmp_path: Path, engine_url: str, engine: docker.DockerClient
) -> None:
    """A member's open terminal (a real shell) and log follow on a real container end
    once the member is removed through the API: the terminal closes with 4403 and its
    shell is hung up; the log stream ends with ``end {"status":"access_ended"}``."""
    with running_server(tmp_path / "home", engine_url) as server, server.client() as c:
        account_id = c.get("/v1/me").json()["data"]["acting"]["account_id"]
        r = c.post(
            f"/v1/accounts/{account_id}/invitations",
            json={"email": "carol@example.com", "role": "member"},
        )
        assert r.status_code == 201, r.text
        r = httpx.post(
            f"{server.url}/v1/invitations/{r.json()['data']['token']}/accept", verify=trusted_tls()
        )
        assert r.status_code == 201, r.text
        member_key = r.json()["data"]["api_key"]["key"]
        member_id = r.json()["data"]["membership"]["id"]
        body = {"docker_image": DEV_IMAGE, "memory_gb": 1, "cpu_cores": 1, "volume_gb": 0}
        r = c.post("/v1/clusters", json={"gpu_type": "NVIDIA RTX A6000", "gpu_count": 1, **body})
        assert r.status_code == 201, r.text
        cid = r.json()["data"]["id"]
        assert wait_status(c, cid, {"running", "error"})["status"] == "running"

        follow_opened = threading.Event()
        streamed: list[Event] = []

        def follow() -> None:
            with (
                httpx.Client(
                    base_url=server.url,
                    headers={"Authorization": f"Bearer {member_key}"},
                    timeout=60,
                    verify=trusted_tls(),
                ) as m,
                m.stream(
                    "GET", f"/v1/clusters/{cid}/logs", params={"follow": "true", "tail": 1}
                ) as resp,
            ):
                assert resp.status_code == 200
                for event in events(resp):
                    streamed.append(event)
                    follow_opened.set()

        follower = threading.Thread(target=follow, daemon=True)
        follower.start()
        assert follow_opened.wait(60), "the log stream never sent its first page"

        async def session() -> tuple[int | None, str]:
            async with websockets.connect(
                ws_url(server, cid), additional_headers={"Authorization": f"Bearer {member_key}"}
            ) as ws:
                await ws.send(b"echo $$ > /tmp/member.pid; echo started\n")
                await read_until(ws, b"\nstarted\r\n")
                gone = await asyncio.to_thread(
                    c.delete, f"/v1/accounts/{account_id}/members/{member_id}"
                )
                assert gone.status_code == 200, gone.text
                with pytest.raises(ConnectionClosed):
                    async with asyncio.timeout(60):
                        while True:
                            await ws.recv()
                return ws.close_code, ws.close_reason or ""

        code, reason = asyncio.run(session())
        assert code == 4403 and "access ended" in reason
        # Its shell is hung up.
        _, pid = sh(engine, server, cid, "cat /tmp/member.pid")
        assert pid.strip().isdigit()
        deadline = time.monotonic() + 30
        while sh(engine, server, cid, f"kill -0 {pid.strip()}")[0] == 0:
            assert time.monotonic() < deadline, "the removed member's shell still runs"
            time.sleep(0.1)
        follower.join(60)
        assert not follower.is_alive(), "the removed member's log stream is still open"
        assert (streamed[-1].event, streamed[-1].json) == ("end", {"status": "access_ended"})
