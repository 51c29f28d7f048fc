"""``GET /v1/hosts``: the installation id (stable across restarts on one home), each
host's stable machine id and whether it enforces CPU/memory limits, in the documented
shape."""

from __future__ import annotations

import uuid
from pathlib import Path

from fastapi.testclient import TestClient
from sqlalchemy import select

from gpuyard.api.app import build_server
from gpuyard.api.rest.schemas.hosts import HostListEnvelope
from gpuyard.services.fleet.identity import HOST_ID_FILE
from gpuyard.store.schema import Installation
from gpuyard.testing.fake_runtime import FakeRuntime
from tests.helpers import LiveServer, live_server, make_settings


def test_hosts_show_installation_and_machine_ids_in_the_documented_shape(
    srv: LiveServer,
) -> None:
    with srv.client() as c:
        body = c.get("/v1/hosts").json()
    HostListEnvelope.model_validate(body)
    data = body["data"]
    with srv.server.ctx.read() as s:
        stored = s.scalars(select(Installation.uuid)).one()
    assert data["installation_id"] == stored == srv.server.ctx.ownership.installation_id
    [host] = data["hosts"]
    home = srv.server.ctx.settings.home
    assert host["machine_id"] == (home / HOST_ID_FILE).read_text().strip()
    assert host["enforces_limits"] is True and host["limits_note"] is None


def test_a_host_that_cannot_enforce_limits_says_so(
    srv: LiveServer, fake_runtime: FakeRuntime
) -> None:
    note = "the engine runs without a cgroup controller for cpu and memory"
    # Said by the engine, as the reconciler's observation stores it (a value written to
    # the store directly would be put right by the next observation).
    fake_runtime.limits_problem = note
    srv.server.reconciler.observe()
    with srv.client() as c:
        body = c.get("/v1/hosts").json()
    HostListEnvelope.model_validate(body)
    [host_out] = body["data"]["hosts"]
    assert host_out["enforces_limits"] is False and host_out["limits_note"] == note


def test_installation_and_host_ids_survive_a_restart_on_the_same_home(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with live_server(make_settings(home), FakeRuntime()) as first, first.client() as c:
        before = c.get("/v1/hosts").json()["data"]
        key = first.key
    uuid.UUID(before["installation_id"])
    # The same home again (a new process, a new port): no new identity of either kind.
    again = build_server(make_settings(home), FakeRuntime(), run_reconciler=False)
    assert again.admin_key is None
    with TestClient(again.app) as c:
        r = c.get("/v1/hosts", headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 200, r.text
    after = r.json()["data"]
    assert after["installation_id"] == before["installation_id"]
    assert [(h["id"], h["machine_id"]) for h in after["hosts"]] == [
        (h["id"], h["machine_id"]) for h in before["hosts"]
    ]
    # A new home is a new installation.
    other = make_settings(tmp_path / "other")
    with live_server(other, FakeRuntime()) as new, new.client() as c:
        fresh = c.get("/v1/hosts").json()["data"]["installation_id"]
    assert fresh != after["installation_id"]
