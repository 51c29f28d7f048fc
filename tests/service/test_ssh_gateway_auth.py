"""The SSH gateway's authentication against a real store (SQLite and PostgreSQL) with
an asyncssh client, no container engine: which keys get in, what the refused are
told, the login event, the per-source limit, and the cross-account probe."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncssh
import pytest
from sqlalchemy import select

from gpuyard.edge.auth_limiter import FailureLimiter
from gpuyard.edge.engines import EngineLocator
from gpuyard.edge.gateway_keys import host_key, upstream_key
from gpuyard.edge.ssh_directory import EVENT_SSH_LOGIN, SshDirectory
from gpuyard.edge.ssh_gateway import Gateway
from gpuyard.reconciler.loop import Reconciler
from gpuyard.runtimes.fake import FakeRuntime
from gpuyard.services import clusters as uc
from gpuyard.services import ssh_keys
from gpuyard.services.auth import Principal
from gpuyard.services.context import Context
from gpuyard.services.requests import CreateCluster
from gpuyard.store.schema import Event


def create(ctx: Context, rec: Reconciler, who: Principal) -> str:
    request = CreateCluster.model_validate({"docker_image": "img", "volume_gb": 0})
    cid = uc.create_cluster(ctx, who, request).id
    for _ in range(5):
        rec.driver.drive(cid)
    assert uc.get_cluster(ctx, who, cid).status == "running"
    return cid


def register(ctx: Context, who: Principal, name: str) -> asyncssh.SSHKey:
    key = asyncssh.generate_private_key("ssh-ed25519")
    with ctx.transaction() as session:
        ssh_keys.add_key(session, who.account_id, name, key.export_public_key().decode())
    return key


class Client(asyncssh.SSHClient):
    def __init__(self) -> None:
        self.banners: list[str] = []

    def auth_banner_received(self, msg: str, lang: str) -> None:
        self.banners.append(msg)


async def login(port: int, user: str, key: asyncssh.SSHKey) -> tuple[bool, str, Any]:
    """(logged in, banners, what ``echo hi`` in a session answered)."""
    client = Client()
    try:
        conn, _ = await asyncssh.create_connection(
            lambda: client, "127.0.0.1", port, username=user, client_keys=[key],
            known_hosts=None, agent_path=None, config=None, preferred_auth="publickey",
        )  # fmt: skip
    except asyncssh.PermissionDenied:
        return False, "".join(client.banners), None
    async with conn:
        result = await asyncio.wait_for(conn.run("echo hi"), 10)
    return True, "".join(client.banners), result


def run_gateway(
    ctx: Context,
    home: Path,
    body: Callable[[int], Awaitable[None]],
    limit: int = 100,
) -> None:
    async def main() -> None:
        gateway = Gateway(
            directory=SshDirectory(ctx.sessions, ctx.ownership),
            # An engine that is not there: sessions fail after the login, with a reason.
            locator=EngineLocator(home, f"unix://{home}/no-engine.sock"),
            limiter=FailureLimiter(limit),
            host_key=host_key(home),
            upstream_key=upstream_key(home),
        )
        acceptor = await gateway.listen("127.0.0.1", 0)
        try:
            await body(acceptor.get_port())
        finally:
            acceptor.close()
            await acceptor.wait_closed()
            await gateway.settle()

    asyncio.run(main())


@pytest.fixture
def rec(ctx: Context) -> Reconciler:
    return Reconciler(ctx, FakeRuntime())


def test_owner_key_logs_in_and_the_login_is_an_event(
    ctx: Context, rec: Reconciler, alice: Principal, tmp_path: Path
) -> None:
    cid = create(ctx, rec, alice)
    key = register(ctx, alice, "laptop")

    async def body(port: int) -> None:
        ok, banner, result = await login(port, cid, key)
        assert ok and banner == ""
        # No engine answers: the session says so and fails (never a silent success).
        assert result.exit_status == 1 and "gpuyard:" in result.stderr
        assert "container engine" in result.stderr

    run_gateway(ctx, tmp_path, body)
    with ctx.read() as session:
        events = list(session.scalars(select(Event).where(Event.type == EVENT_SSH_LOGIN)))
    assert len(events) == 1 and events[0].cluster_id == cid
    message = events[0].message
    assert "'laptop'" in message and "SHA256:" in message and "127.0.0.1:" in message
    assert key.export_public_key().decode().split()[1] not in message


def test_refusals_say_why_without_telling_strangers_what_exists(
    ctx: Context, rec: Reconciler, alice: Principal, tmp_path: Path
) -> None:
    cid = create(ctx, rec, alice)
    key = register(ctx, alice, "laptop")
    stranger = asyncssh.generate_private_key("ssh-ed25519")
    stopped = create(ctx, rec, alice)
    uc.stop_cluster(ctx, alice, stopped)
    for _ in range(5):
        rec.driver.drive(stopped)

    async def body(port: int) -> None:
        ok, wrong_key, _ = await login(port, cid, stranger)
        assert not ok and "no such cluster, or the key is not registered" in wrong_key
        ok, unknown, _ = await login(port, "zzzzzzzzzzzzzz", key)
        assert not ok
        # The same words for an unknown cluster as for a wrong key.
        assert (
            unknown.replace("zzzzzzzzzzzzzz", cid).split("key SHA256:")[0]
            == (wrong_key.split("key SHA256:")[0])
        )
        ok, garbage, _ = await login(port, "../../etc/passwd", key)
        assert not ok and "that user" in garbage and "passwd" not in garbage
        ok, status, _ = await login(port, stopped, key)
        assert not ok and f"cluster {stopped} is stopped: start it first" in status

    run_gateway(ctx, tmp_path, body)


def test_cross_account_probe_gets_nowhere(
    ctx: Context, rec: Reconciler, alice: Principal, bob: Principal, tmp_path: Path
) -> None:
    a, b = create(ctx, rec, alice), create(ctx, rec, bob)
    alice_key, bob_key = register(ctx, alice, "a"), register(ctx, bob, "b")

    async def body(port: int) -> None:
        successes = 0
        for _ in range(10):
            for cid, key in ((a, bob_key), (b, alice_key)):
                ok, _, _ = await login(port, cid, key)
                successes += ok
        assert successes == 0
        assert (await login(port, a, alice_key))[0] and (await login(port, b, bob_key))[0]

    run_gateway(ctx, tmp_path, body)


def test_a_source_with_too_many_failures_is_refused_even_with_a_good_key(
    ctx: Context, rec: Reconciler, alice: Principal, tmp_path: Path
) -> None:
    cid = create(ctx, rec, alice)
    key = register(ctx, alice, "laptop")
    stranger = asyncssh.generate_private_key("ssh-ed25519")

    async def body(port: int) -> None:
        assert (await login(port, cid, key))[0]
        for _ in range(3):
            assert not (await login(port, cid, stranger))[0]
        ok, banner, _ = await login(port, cid, key)
        assert not ok and "too many failed logins from 127.0.0.1" in banner

    run_gateway(ctx, tmp_path, body, limit=3)


def test_the_account_keys_reach_the_container_env(
    ctx: Context, alice: Principal, tmp_path: Path
) -> None:
    runtime = FakeRuntime()
    rec = Reconciler(ctx, runtime)
    key = register(ctx, alice, "laptop")
    cid = create(ctx, rec, alice)
    env = runtime.containers[cid].spec.env
    assert env["PUBLIC_KEY"] == key.export_public_key().decode().strip()


def test_keys_per_connection_count_only_refusals(
    ctx: Context, rec: Reconciler, alice: Principal, tmp_path: Path
) -> None:
    cid = create(ctx, rec, alice)
    key = register(ctx, alice, "laptop")
    strangers = [asyncssh.generate_private_key("ssh-ed25519") for _ in range(7)]

    async def offer(port: int, keys: list[asyncssh.SSHKey]) -> bool:
        try:
            conn = await asyncssh.connect(
                "127.0.0.1", port, username=cid, client_keys=keys,
                known_hosts=None, agent_path=None, config=None,
            )  # fmt: skip
        except (asyncssh.PermissionDenied, asyncssh.DisconnectError):
            return False
        conn.close()
        return True

    async def body(port: int) -> None:
        # An agent with five other keys before the right one still gets in (the 6th).
        assert await offer(port, [*strangers[:5], key])
        # The 7th key is never looked at: six refusals end the connection.
        assert not await offer(port, [*strangers[:6], key])

    run_gateway(ctx, tmp_path, body)
