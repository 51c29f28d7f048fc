"""A database read never runs on the event loop: while one request's read hangs, the
server keeps answering everything else (issue 10, item 7; DESIGN.md rule 10).

The real app over real HTTP; the hang is injected into the server's own Context —
either around its accelerated SQLite cluster reader or, with that reader removed (the
PostgreSQL deployments' path), as an engine hook that holds the cluster query — never
by patching a module.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, event

from gpuyard.services.context import ClusterReader, Context
from gpuyard.store.schema import Cluster
from tests.helpers import LiveServer

HANG_S = 30.0
# Half the hang: an answer within it came while the held read still hung (a stalled
# server would answer only after HANG_S), however slow a loaded machine is otherwise.
PROMPT_S = HANG_S / 2


class Gate:
    """Holds every read of one cluster id until released (or HANG_S passes)."""

    def __init__(self, cluster_id: str) -> None:
        self.cluster_id = cluster_id
        self.entered = threading.Event()
        self.released = threading.Event()

    def hold(self, cluster_id: str) -> None:
        if cluster_id == self.cluster_id:
            self.entered.set()
            self.released.wait(HANG_S)


class GatedReader:
    """The server's own cluster reader, with reads of the gate's cluster held."""

    def __init__(self, inner: ClusterReader, gate: Gate) -> None:
        self.inner = inner
        self.gate = gate

    def __call__(self, cluster_id: str, account_id: int) -> Cluster | None:
        self.gate.hold(cluster_id)
        return self.inner(cluster_id, account_id)


@contextmanager
def reads_held(ctx: Context, gate: Gate, path: str) -> Iterator[None]:
    """Make the server's cluster reads of the gate's cluster hang, through ``path``:
    ``reader`` (the SQLite accelerated reader) or ``engine`` (SQLAlchemy)."""
    original = ctx.cluster_reader
    if path == "reader":
        assert original is not None, "a file-backed SQLite store has an accelerated reader"
        ctx.cluster_reader = GatedReader(original, gate)
        try:
            yield
        finally:
            ctx.cluster_reader = original
        return
    engine = ctx.sessions.kw["bind"]
    assert isinstance(engine, Engine)

    def before(_conn: Any, _cursor: Any, statement: str, params: Any, *_: Any) -> None:
        # Only the visible-cluster read (it joins projects); the reconciler's own
        # queries of the cluster go on.
        if "JOIN projects" in statement and gate.cluster_id in tuple(params or ()):
            gate.hold(gate.cluster_id)

    ctx.cluster_reader = None
    event.listen(engine, "before_cursor_execute", before)
    try:
        yield
    finally:
        event.remove(engine, "before_cursor_execute", before)
        ctx.cluster_reader = original


def _create(client: httpx.Client, name: str) -> str:
    r = client.post(
        "/v1/clusters",
        json={
            "name": name,
            "gpu_type": "NVIDIA RTX A6000",
            "gpu_count": 1,
            "docker_image": "localhost/gpuyard/busybox:latest",
            "volume_gb": 1,
        },
    )
    assert r.status_code == 201, r.text
    cluster_id: str = r.json()["data"]["id"]
    return cluster_id


def _prompt(client: httpx.Client, url: str) -> httpx.Response:
    try:
        return client.get(url, timeout=PROMPT_S)
    except httpx.TimeoutException:
        pytest.fail(f"GET {url} got no answer while another request's read hung")


@pytest.mark.parametrize("path", ["reader", "engine"])
@pytest.mark.parametrize("template", ["/v1/clusters/{}", "/v2/clusters/{}"])
def test_a_hung_cluster_read_stalls_no_other_request(
    srv: LiveServer, template: str, path: str
) -> None:
    with srv.client() as client:
        hung = _create(client, "hung")
        other = _create(client, "other")
        gate = Gate(hung)
        answers: list[httpx.Response] = []
        with reads_held(srv.server.ctx, gate, path):
            waiter = threading.Thread(
                target=lambda: answers.append(client.get(template.format(hung))), daemon=True
            )
            try:
                waiter.start()
                assert gate.entered.wait(10), "the held read never started"
                health = _prompt(client, "/healthz")
                assert health.status_code == 200
                # The same endpoint, for a cluster whose read does not hang.
                sibling = _prompt(client, template.format(other))
                assert sibling.status_code == 200, sibling.text
                assert other in sibling.text
                assert not answers, "the held request answered before its read finished"
            finally:
                gate.released.set()
                waiter.join(HANG_S)
        assert len(answers) == 1
        assert answers[0].status_code == 200, answers[0].text
        assert hung in answers[0].text
