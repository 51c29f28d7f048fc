"""Over real HTTP: a start right after a stop is accepted on every surface and the
cluster ends running (the fake engine holds the stop until the start has answered, so
the start surely arrives while the cluster is stopping)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gpuyard.testing.fake_runtime import FakeRuntime
from tests.helpers import LiveServer, created

BODY: dict[str, Any] = {"gpu_type": "NVIDIA RTX A6000", "gpu_count": 1, "docker_image": "img"}


@pytest.fixture
def held(fake_runtime: FakeRuntime) -> Iterator[threading.Event]:
    """Open it to let held stops finish (it is opened at the test's end in any case)."""
    gate = threading.Event()
    yield gate
    gate.set()


def _stopping(srv: LiveServer, c: httpx.Client, runtime: FakeRuntime, gate: threading.Event) -> str:
    cid = created(srv, c, BODY)
    runtime.stop_gate = gate
    r = c.post(f"/v1/clusters/{cid}/stop")
    assert r.status_code == 200, r.text
    return cid


def _status(c: httpx.Client, cid: str) -> str:
    status: str = c.get(f"/v1/clusters/{cid}").json()["data"]["status"]
    return status


def test_v1_start_while_stopping_is_accepted(
    srv: LiveServer, fake_runtime: FakeRuntime, held: threading.Event
) -> None:
    with srv.client() as c:
        cid = _stopping(srv, c, fake_runtime, held)
        r = c.post(f"/v1/clusters/{cid}/start", json={"environment_updates": {"B": "2"}})
        assert r.status_code == 200, r.text
        data = r.json()["data"]
        assert data["status"] == "stopping" and data["desired_status"] == "running"
        assert "start" in data["actions"]
        held.set()
        assert srv.server.reconciler.wait_idle(20)
        assert _status(c, cid) == "running"
        assert fake_runtime.containers[cid].spec.env["B"] == "2"


def test_v1_start_with_wait_for_ready_right_after_stop(
    srv: LiveServer, fake_runtime: FakeRuntime, held: threading.Event
) -> None:
    with srv.client() as c:
        cid = _stopping(srv, c, fake_runtime, held)
        # The stop finishes while the start waits.
        threading.Timer(0.5, held.set).start()
        r = c.post(f"/v1/clusters/{cid}/start", json={"wait_for_ready": True, "timeout_minutes": 1})
        assert r.status_code == 200, r.text
        assert r.json()["data"]["status"] == "running"
        assert r.json()["meta"]["wait_timed_out"] is False


def test_v2_start_while_stopping_is_accepted(
    srv: LiveServer, fake_runtime: FakeRuntime, held: threading.Event
) -> None:
    with srv.client() as c:
        cid = _stopping(srv, c, fake_runtime, held)
        r = c.post(f"/v2/clusters/{cid}/start", json={})
        assert r.status_code == 200, r.text
        held.set()
        assert srv.server.reconciler.wait_idle(20)
        assert _status(c, cid) == "running"


def test_graphql_pod_resume_right_after_pod_stop(
    srv: LiveServer, fake_runtime: FakeRuntime, held: threading.Event
) -> None:
    with srv.client() as c:
        cid = created(srv, c, BODY)
        fake_runtime.stop_gate = held
        stop = srv.graphql(f'mutation {{ podStop(input: {{podId: "{cid}"}}) {{ id }} }}')
        assert "errors" not in stop, stop
        resumed = srv.graphql(
            f'mutation {{ podResume(input: {{podId: "{cid}", gpuCount: 1}}) '
            "{ id desiredStatus status } }"
        )
        assert "errors" not in resumed, resumed
        assert resumed["data"]["podResume"] == {
            "id": cid,
            "desiredStatus": "RUNNING",
            "status": "stopping",
        }
        held.set()
        assert srv.server.reconciler.wait_idle(20)
        assert _status(c, cid) == "running"
