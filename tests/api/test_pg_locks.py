"""A query waiting on a PostgreSQL lock stalls only its own request (issue 16, item 4).

The real app over real HTTP on PostgreSQL (skipped without GPUYARD_TEST_POSTGRES_URL).
Another connection, as another client of the database would, holds a lock; one request
that needs it waits in the database (seen in ``pg_locks`` as an ungranted lock of a
backend of ours), and while it waits, with the lock still held, ``/healthz``, cluster
reads through the fast path and the routed v2 GET, GraphQL and another async route all
answer. When the lock is released the waiting request completes.

No timing is asserted beyond "answered at all before a generous timeout": what is
checked is that each answer came while the lock was still held and the other request
was still waiting.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from sqlalchemy import Connection, create_engine, text

from gpuyard.services.tenancy.auth import Scope, issue_key, resolve_key
from gpuyard.testing.fake_runtime import FakeRuntime
from tests.helpers import LiveServer, live_server, make_settings

# Only for answers that must come while the lock is held: far above any answer of an
# idle test server, and the test fails rather than hangs when one does not come.
ANSWER_TIMEOUT_S = 20.0
WAIT_S = 30.0

CLUSTER = {
    "gpu_type": "NVIDIA RTX A6000",
    "gpu_count": 1,
    "docker_image": "localhost/gpuyard/busybox:latest",
    "volume_gb": 1,
}


@pytest.fixture
def pg_srv(database_url: str, tmp_path: Path) -> Iterator[LiveServer]:
    """The real app over real HTTP on a fresh PostgreSQL database."""
    settings = make_settings(tmp_path / "home", database_url)
    with live_server(settings, FakeRuntime()) as server:
        yield server


@dataclass
class Locker:
    """A connection of its own holding locks in one open transaction."""

    conn: Connection
    database: str

    def waiters(self) -> int:
        """Backends of this database (other than ours) waiting for a lock now."""
        found = self.conn.execute(
            text(
                "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
                "WHERE NOT l.granted AND a.datname = :db AND a.pid <> pg_backend_pid()"
            ),
            {"db": self.database},
        ).scalar_one()
        return int(found)


@pytest.fixture
def locker(pg_srv: LiveServer) -> Iterator[Locker]:
    url = pg_srv.server.ctx.settings.effective_database_url
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            database = conn.execute(text("SELECT current_database()")).scalar_one()
            yield Locker(conn, str(database))
            conn.rollback()
    finally:
        engine.dispose()


def _create(client: httpx.Client, name: str) -> str:
    r = client.post("/v1/clusters", json={"name": name, **CLUSTER})
    assert r.status_code == 201, r.text
    cluster_id: str = r.json()["data"]["id"]
    return cluster_id


def _stopped(client: httpx.Client, cluster_id: str) -> None:
    """Stop the cluster and wait until it is recorded stopped."""
    r = client.post(f"/v1/clusters/{cluster_id}/stop")
    assert r.status_code == 200, r.text
    for _ in range(int(WAIT_S / 0.05)):
        status = client.get(f"/v1/clusters/{cluster_id}").json()["data"]["status"]
        if status == "stopped":
            return
        time.sleep(0.05)
    pytest.fail(f"cluster {cluster_id} never stopped (last: {status})")


class Blocked:
    """One request sent from a thread of its own; its answer once it comes."""

    def __init__(self, send: Callable[[], httpx.Response]) -> None:
        self.answer: httpx.Response | None = None
        self.done = threading.Event()

        def run() -> None:
            try:
                self.answer = send()
            finally:
                self.done.set()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()


def _wait_for_waiter(locker: Locker, blocked: Blocked) -> None:
    """Until the blocked request's query waits on the lock in the database."""
    for _ in range(int(WAIT_S / 0.05)):
        if locker.waiters() > 0:
            return
        assert not blocked.done.is_set(), f"the request did not wait: {blocked.answer}"
        blocked.done.wait(0.05)
    pytest.fail("no query of the server ever waited on the held lock")


def _answered_while_held(
    locker: Locker, blocked: Blocked, client: httpx.Client, method: str, url: str, **kw: object
) -> httpx.Response:
    """``method url`` answered while the lock is held and the blocked request waits."""
    try:
        r = client.request(method, url, timeout=ANSWER_TIMEOUT_S, **kw)  # type: ignore[arg-type]
    except httpx.TimeoutException:
        pytest.fail(f"{method} {url} got no answer while another request waited on a lock")
    assert not blocked.done.is_set(), "the blocked request answered while the lock was held"
    assert locker.waiters() > 0, f"{method} {url} answered only after the lock wait ended"
    return r


def _others_answer(locker: Locker, blocked: Blocked, client: httpx.Client, other: str) -> None:
    health = _answered_while_held(locker, blocked, client, "GET", "/healthz")
    assert health.status_code == 200, health.text
    one = _answered_while_held(locker, blocked, client, "GET", f"/v1/clusters/{other}")
    assert one.status_code == 200 and one.json()["data"]["id"] == other, one.text
    # Routed, async, on the read lane behind the current_principal dependency.
    v2 = _answered_while_held(locker, blocked, client, "GET", f"/v2/clusters/{other}")
    assert v2.status_code == 200 and v2.json()["id"] == other, v2.text
    # Async route reading on a worker thread.
    bill = _answered_while_held(locker, blocked, client, "GET", "/v1/billing")
    assert bill.status_code == 200 and bill.json()["success"] is True, bill.text
    gql = _answered_while_held(
        locker, blocked, client, "POST", "/graphql", json={"query": "{ myself { pods { id } } }"}
    )
    assert gql.status_code == 200, gql.text
    pods = {p["id"] for p in gql.json()["data"]["myself"]["pods"]}
    assert other in pods, gql.text


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_a_start_waiting_on_a_row_lock_stalls_no_other_request(
    pg_srv: LiveServer, locker: Locker
) -> None:
    with pg_srv.client() as client, pg_srv.client() as waiting:
        held = _create(client, "held")
        other = _create(client, "other")
        _stopped(client, held)
        locker.conn.execute(text("SELECT id FROM clusters WHERE id = :id FOR UPDATE"), {"id": held})
        # An async route whose write waits on the row lock.
        blocked = Blocked(
            lambda: waiting.post(f"/v1/clusters/{held}/start", json={}, timeout=WAIT_S * 2)
        )
        try:
            _wait_for_waiter(locker, blocked)
            _others_answer(locker, blocked, client, other)
            # A read of the locked row itself does not wait on a writer's lock.
            same = _answered_while_held(locker, blocked, client, "GET", f"/v1/clusters/{held}")
            assert same.status_code == 200 and same.json()["data"]["id"] == held, same.text
        finally:
            locker.conn.rollback()
        assert blocked.done.wait(WAIT_S), "the blocked request never completed"
        assert blocked.answer is not None
        assert blocked.answer.status_code == 200, blocked.answer.text
        assert blocked.answer.json()["data"]["id"] == held


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_a_key_read_waiting_on_a_table_lock_stalls_no_other_request(
    pg_srv: LiveServer, locker: Locker
) -> None:
    ctx = pg_srv.server.ctx
    # The admin key stays cached through the lock (a stale entry's refresh would read
    # the locked table too): only the new key has to wait on it, as meant.
    pg_srv.server.app.state.gpuyard.keys.ttl_s = 3600.0
    with pg_srv.client() as client:
        other = _create(client, "other")
        with ctx.read() as session:
            admin = resolve_key(session, pg_srv.key)
        with ctx.transaction() as session:
            fresh = issue_key(
                session, user_id=admin.user_id, account_id=admin.account_id, name="new",
                scope=Scope.READ,
            )  # fmt: skip
        # No request has used this key: its first one reads api_keys, and waits.
        locker.conn.execute(text("LOCK TABLE api_keys IN ACCESS EXCLUSIVE MODE"))
        with pg_srv.client(fresh.key) as waiting:
            blocked = Blocked(lambda: waiting.get(f"/v1/clusters/{other}", timeout=WAIT_S * 2))
            try:
                _wait_for_waiter(locker, blocked)
                _others_answer(locker, blocked, client, other)
            finally:
                locker.conn.rollback()
            assert blocked.done.wait(WAIT_S), "the blocked request never completed"
        assert blocked.answer is not None
        assert blocked.answer.status_code == 200, blocked.answer.text
        assert blocked.answer.json()["data"]["id"] == other
