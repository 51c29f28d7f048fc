"""A key check cancelled half-way (asyncssh cancels one in flight when the next userauth
request arrives) must not leave one account's keys beside another account's cluster."""

from __future__ import annotations

import asyncio
import contextlib
import time

import asyncssh

from gpuyard.edge.auth_limiter import FailureLimiter
from gpuyard.edge.ssh_directory import AccountKey, ClusterTarget
from gpuyard.edge.ssh_gateway import Gateway, GatewayConnection

OWN, VICTIM = "aaaaaaaaaaaaaa", "bbbbbbbbbbbbbb"


def target(cluster_id: str, account_id: int) -> ClusterTarget:
    return ClusterTarget(
        cluster_id, account_id, "running", "c-" + cluster_id, None, True, None, None, None, None
    )


def test_a_cancelled_lookup_leaves_no_mixed_state() -> None:
    attacker = asyncssh.generate_private_key("ssh-ed25519")
    victim = asyncssh.generate_private_key("ssh-ed25519")

    class Directory:
        def target(self, cluster_id: str) -> ClusterTarget | None:
            return {OWN: target(OWN, 1), VICTIM: target(VICTIM, 2)}.get(cluster_id)

        def login_keys(self, target: ClusterTarget) -> list[AccountKey]:
            account_id = target.account_id
            if account_id == 2:
                time.sleep(0.3)  # the second read of the lookup is in flight
            key = attacker if account_id == 1 else victim
            return [AccountKey(account_id, "k", "fp", key.public_data)]

    gateway = Gateway(
        directory=Directory(),  # type: ignore[arg-type]
        locator=None,  # type: ignore[arg-type]
        limiter=FailureLimiter(10),
        host_key=attacker,
        upstream_key=attacker,
    )

    async def attack() -> tuple[bool, bool]:
        conn = GatewayConnection(gateway)
        key = asyncssh.import_public_key(attacker.export_public_key())
        own = await conn.validate_public_key(OWN, key)
        check = asyncio.create_task(conn.validate_public_key(VICTIM, key))
        await asyncio.sleep(0.1)
        check.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await check
        return own, await conn.validate_public_key(VICTIM, key)

    own, victims = asyncio.run(attack())
    assert own is True
    assert victims is False
