"""The SSH gateway's authentication against a real store (SQLite and PostgreSQL) with
an asyncssh client, no container engine: which keys get in, what the refused are
told, the login event, the per-source limit, and the cross-account probe."""

from __future__ import annotations

import asyncio
import subprocess
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
from gpuyard.edge.ssh_upstream import AUTHORIZED_KEYS_SCRIPT, sync_input
from gpuyard.reconciler.loop import Reconciler
from gpuyard.reconciler.wiring import build_reconciler
from gpuyard.services.access import ssh_keys
from gpuyard.services.clusters import use_cases as uc
from gpuyard.services.clusters.requests import CreateCluster
from gpuyard.services.context import Context
from gpuyard.services.tenancy import api_keys, members, projects
from gpuyard.services.tenancy.auth import Principal, resolve_key
from gpuyard.store.schema import Event
from gpuyard.testing.fake_runtime import FakeRuntime


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
        ssh_keys.add_key(
            session, who.account_id, name, key.export_public_key().decode(), user_id=who.user_id
        )
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
    session_check_s: float = 2.0,
) -> None:
    async def main() -> None:
        gateway = Gateway(
            directory=SshDirectory(ctx.sessions, ctx.ownership),
            # An engine that is not there: sessions fail after the login, with a reason.
            locator=EngineLocator(home, f"unix://{home}/no-engine.sock"),
            limiter=FailureLimiter(limit),
            host_key=host_key(home),
            upstream_key=upstream_key(home),
            session_check_s=session_check_s,
        )
        acceptor = await gateway.listen("127.0.0.1", 0)
        try:
            await body(acceptor.get_port())
        finally:
            acceptor.close()
            await acceptor.wait_closed()
            gateway.stop_watching()
            await gateway.settle()

    asyncio.run(main())


@pytest.fixture
def rec(ctx: Context) -> Reconciler:
    return build_reconciler(ctx, FakeRuntime())


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
    rec = build_reconciler(ctx, runtime)
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


# -- membership ends, access ends ------------------------------------------------------


def member_of(ctx: Context, owner: Principal, email: str, role: str = "member") -> Principal:
    """A new user invited into ``owner``'s account as ``role``, acting with their key."""
    inv = members.create_invitation(ctx, owner, owner.account_id, email, role, None)
    made = members.accept_invitation(ctx, inv.token, name=None, caller=None)
    with ctx.read() as session:
        return resolve_key(session, made["api_key"]["key"])


async def until(check: Callable[[], Awaitable[bool]], timeout_s: float = 30.0) -> None:
    """Poll ``check`` until it holds (fails the test after ``timeout_s``)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, "condition never held"
        await asyncio.sleep(0.05)


def test_a_removed_members_key_is_refused_and_their_open_session_closed(
    ctx: Context, rec: Reconciler, alice: Principal, tmp_path: Path
) -> None:
    carol = member_of(ctx, alice, "carol@example.com")
    cid = create(ctx, rec, alice)
    key = register(ctx, carol, "carols")
    owners = register(ctx, alice, "alices")

    async def body(port: int) -> None:
        assert (await login(port, cid, key))[0]
        open_conn = await asyncssh.connect(
            "127.0.0.1", port, username=cid, client_keys=[key],
            known_hosts=None, agent_path=None, config=None,
        )  # fmt: skip
        assert carol.member_id is not None
        await asyncio.to_thread(
            members.remove_member, ctx, alice, alice.account_id, carol.member_id
        )
        ok, banner, _ = await login(port, cid, key)
        assert not ok and "may not log in" in banner
        # The connection opened before the removal is ended by the session check.
        await asyncio.wait_for(open_conn.wait_closed(), 30)
        # The owner's key still opens the cluster.
        assert (await login(port, cid, owners))[0]

    run_gateway(ctx, tmp_path, body, session_check_s=0.2)


def test_demoted_or_moved_off_the_project_the_key_no_longer_opens(
    ctx: Context, rec: Reconciler, alice: Principal, tmp_path: Path
) -> None:
    carol = member_of(ctx, alice, "carol@example.com")
    dave = member_of(ctx, alice, "dave@example.com")
    cid = create(ctx, rec, alice)
    other = projects.create_project(ctx, alice, None, "other").id
    carols, daves = register(ctx, carol, "c"), register(ctx, dave, "d")
    # A key registered through an API key restricted to the other project.
    pinned = asyncssh.generate_private_key("ssh-ed25519")
    with ctx.transaction() as session:
        ssh_keys.add_key(
            session, alice.account_id, "pinned", pinned.export_public_key().decode(),
            user_id=alice.user_id, project_id=other,
        )  # fmt: skip

    async def body(port: int) -> None:
        assert (await login(port, cid, carols))[0] and (await login(port, cid, daves))[0]
        assert not (await login(port, cid, pinned))[0]
        assert carol.member_id is not None and dave.member_id is not None
        members.change_role(ctx, alice, alice.account_id, carol.member_id, "viewer")
        projects.add_project_member(ctx, alice, other, dave.member_id)
        assert not (await login(port, cid, carols))[0]
        assert not (await login(port, cid, daves))[0]

    run_gateway(ctx, tmp_path, body)


def test_revoking_the_last_api_key_ends_ssh_access(
    ctx: Context, rec: Reconciler, alice: Principal, tmp_path: Path
) -> None:
    carol = member_of(ctx, alice, "carol@example.com")
    cid = create(ctx, rec, alice)
    key = register(ctx, carol, "c")

    async def body(port: int) -> None:
        assert (await login(port, cid, key))[0]
        api_keys.revoke_key(ctx, carol, carol.key_id)
        assert not (await login(port, cid, key))[0]

    run_gateway(ctx, tmp_path, body)


def test_the_sshd_keys_follow_access(ctx: Context, rec: Reconciler, alice: Principal) -> None:
    carol = member_of(ctx, alice, "carol@example.com")
    request = CreateCluster.model_validate(
        {
            "docker_image": "img",
            "volume_gb": 0,
            "ports": [{"internal_port": 22, "external_port": 0, "protocol": "tcp"}],
        }
    )
    cid = uc.create_cluster(ctx, alice, request).id
    for _ in range(5):
        rec.driver.drive(cid)
    register(ctx, alice, "a")
    carols = register(ctx, carol, "c")
    directory = SshDirectory(ctx.sessions, ctx.ownership)

    def lines() -> list[str]:
        found = [lines for t, lines in directory.running_with_sshd() if t.cluster_id == cid]
        assert len(found) == 1
        return found[0]

    carol_line = carols.export_public_key().decode().strip()
    assert carol_line in lines() and len(lines()) == 2
    assert carol.member_id is not None
    members.remove_member(ctx, alice, alice.account_id, carol.member_id)
    assert carol_line not in lines() and len(lines()) == 1


def test_a_removed_members_key_line_outside_the_block_is_dropped(
    ctx: Context, rec: Reconciler, alice: Principal, tmp_path: Path
) -> None:
    """An image appends ``$PUBLIC_KEY`` (the keys at creation) outside gpuyard's block:
    once carol is removed, the sync deletes her line there too, and keeps a line the
    user added that gpuyard never registered."""
    carol = member_of(ctx, alice, "carol@example.com")
    request = CreateCluster.model_validate(
        {
            "docker_image": "img",
            "volume_gb": 0,
            "ports": [{"internal_port": 22, "external_port": 0, "protocol": "tcp"}],
        }
    )
    cid = uc.create_cluster(ctx, alice, request).id
    for _ in range(5):
        rec.driver.drive(cid)
    alice_line = register(ctx, alice, "a").export_public_key().decode().strip()
    carol_line = register(ctx, carol, "c").export_public_key().decode().strip()
    users_own = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().strip()
    (tmp_path / ".ssh").mkdir()
    keys_file = tmp_path / ".ssh" / "authorized_keys"
    keys_file.write_text(f"{alice_line}\n{carol_line}\n{users_own}\n")
    directory = SshDirectory(ctx.sessions, ctx.ownership)

    def sync() -> list[str]:
        found = [(lines, drop) for t, lines, drop in directory.sshd_keys() if t.cluster_id == cid]
        assert len(found) == 1
        script = AUTHORIZED_KEYS_SCRIPT.replace("/root/.ssh", str(tmp_path / ".ssh"))
        done = subprocess.run(
            ["/bin/sh", "-c", script], input=sync_input(*found[0]), capture_output=True, check=False
        )
        assert done.returncode == 0, done.stderr
        return keys_file.read_text().splitlines()

    assert carol_line in sync()
    assert carol.member_id is not None
    members.remove_member(ctx, alice, alice.account_id, carol.member_id)
    after = sync()
    assert carol_line not in after
    assert users_own in after and after.count(alice_line) == 2  # hers + the block's
