"""Over real HTTP: a start right after a stop is accepted on every surface and the
cluster ends running (the fake engine fails the first stop, so the start reliably
arrives while the cluster is still stopping)."""

from __future__ import annotations

from typing import Any

import httpx

from gpuyard.runtimes.fake import FakeRuntime
from tests.helpers import LiveServer, created

BODY: dict[str, Any] = {"gpu_type": "NVIDIA RTX A6000", "gpu_count": 1, "docker_image": "img"}


def _stopping(srv: LiveServer, c: httpx.Client, runtime: FakeRuntime) -> str:
    cid = created(srv, c, BODY)
    runtime.fail_next["stop"] = "engine busy"
    r = c.post(f"/v1/clusters/{cid}/stop")
    assert r.status_code == 200, r.text
    return cid


def _status(c: httpx.Client, cid: str) -> str:
    status: str = c.get(f"/v1/clusters/{cid}").json()["data"]["status"]
    return status


def test_v1_start_while_stopping_is_accepted(srv: LiveServer, fake_runtime: FakeRuntime) -> None:
    with srv.client() as c:
        cid = _stopping(srv, c, fake_runtime)
        r = c.post(f"/v1/clusters/{cid}/start", json={"environment_updates": {"B": "2"}})
        assert r.status_code == 200, r.text
        data = r.json()["data"]
        assert data["status"] in {"stopping", "stopped", "starting", "running"}
        assert srv.server.reconciler.wait_idle(20)
        assert _status(c, cid) == "running"
        assert fake_runtime.containers[cid].spec.env["B"] == "2"


def test_v1_start_with_wait_for_ready_right_after_stop(
    srv: LiveServer, fake_runtime: FakeRuntime
) -> None:
    with srv.client() as c:
        cid = _stopping(srv, c, fake_runtime)
        r = c.post(f"/v1/clusters/{cid}/start", json={"wait_for_ready": True, "timeout_minutes": 1})
        assert r.status_code == 200, r.text
        assert r.json()["data"]["status"] == "running"
        assert r.json()["meta"]["wait_timed_out"] is False


def test_v2_start_while_stopping_is_accepted(srv: LiveServer, fake_runtime: FakeRuntime) -> None:
    with srv.client() as c:
        cid = _stopping(srv, c, fake_runtime)
        r = c.post(f"/v2/clusters/{cid}/start", json={})
        assert r.status_code == 200, r.text
        assert srv.server.reconciler.wait_idle(20)
        assert _status(c, cid) == "running"


def test_graphql_pod_resume_right_after_pod_stop(
    srv: LiveServer, fake_runtime: FakeRuntime
) -> None:
    with srv.client() as c:
        cid = created(srv, c, BODY)
        fake_runtime.fail_next["stop"] = "engine busy"
        stop = srv.graphql(f'mutation {{ podStop(input: {{podId: "{cid}"}}) {{ id }} }}')
        assert "errors" not in stop, stop
        resumed = srv.graphql(
            f'mutation {{ podResume(input: {{podId: "{cid}", gpuCount: 1}}) '
            "{ id desiredStatus } }"
        )
        assert "errors" not in resumed, resumed
        assert resumed["data"]["podResume"] == {"id": cid, "desiredStatus": "RUNNING"}
        assert srv.server.reconciler.wait_idle(20)
        assert _status(c, cid) == "running"
