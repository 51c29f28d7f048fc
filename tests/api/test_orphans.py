"""``/v1/orphans`` and ``gpuyard orphans`` over real HTTP: quarantined volumes are
listed for admins with their size, deleted on request, and never shown to others."""

from __future__ import annotations

from typing import Any

import httpx

from gpuyard.api.rest.orphans import OrphanEnvelope, OrphanListEnvelope
from gpuyard.testing.fake_runtime import FakeRuntime
from tests.api.test_cli import run
from tests.api.test_rest_errors import key_for
from tests.helpers import LiveServer


def _quarantine(srv: LiveServer, runtime: FakeRuntime, cluster_id: str) -> str:
    name = srv.server.ctx.ownership.volume(cluster_id)
    runtime.ensure_volume(name, cluster_id)
    runtime.volumes[name].files["weights.bin"] = "w" * 2048
    srv.server.reconciler.scan_volumes()
    return name


def _orphans(c: httpx.Client, **params: Any) -> list[dict[str, Any]]:
    body = c.get("/v1/orphans", params=params).json()
    OrphanListEnvelope.model_validate(body)
    rows: list[dict[str, Any]] = body["data"]["orphans"]
    return rows


def test_orphans_listed_and_deleted_by_an_admin(srv: LiveServer, fake_runtime: FakeRuntime) -> None:
    name = _quarantine(srv, fake_runtime, "lostcluster001")
    with srv.client() as c:
        listing = c.get("/v1/orphans").json()
        assert listing["data"]["installation_id"] == srv.server.ctx.ownership.installation_id
        (row,) = _orphans(c)
        assert row["name"] == name and row["size_bytes"] == 2048
        assert row["status"] == "quarantined" and row["cluster_id"] == "lostcluster001"
        assert name in fake_runtime.volumes  # found, not deleted
        deleted = c.delete(f"/v1/orphans/{row['id']}")
        assert deleted.status_code == 200, deleted.text
        OrphanEnvelope.model_validate(deleted.json())
        assert deleted.json()["data"]["status"] == "deleted"
        assert name not in fake_runtime.volumes
        assert _orphans(c) == []
        assert [r["status"] for r in _orphans(c, all="true")] == ["deleted"]
        again = c.delete(f"/v1/orphans/{row['id']}")
        assert again.status_code == 404 and again.json()["error"]["code"] == "NOT_FOUND"
        bad = c.delete("/v1/orphans/abc")
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "VALIDATION_ERROR"


def test_orphans_need_an_admin_key(srv: LiveServer, fake_runtime: FakeRuntime) -> None:
    _quarantine(srv, fake_runtime, "lostcluster002")
    with srv.client(key_for(srv, "u@example.com")) as c:
        listed = c.get("/v1/orphans")
        assert listed.status_code == 403 and listed.json()["success"] is False
        assert c.delete("/v1/orphans/1").status_code == 403
    with srv.client() as c:
        assert len(_orphans(c)) == 1


def test_orphans_cli(srv: LiveServer, fake_runtime: FakeRuntime) -> None:
    name = _quarantine(srv, fake_runtime, "lostcluster003")
    shown = run(srv, "orphans")
    assert shown.exit_code == 0, shown.output
    assert name in shown.output and "2.0 KiB" in shown.output and "quarantined" in shown.output
    assert srv.server.ctx.ownership.installation_id in shown.output
    with srv.client() as c:
        (row,) = _orphans(c)
    gone = run(srv, "orphans", "delete", str(row["id"]))
    assert gone.exit_code == 0, gone.output
    assert f"deleted volume {name}" in gone.output
    missing = run(srv, "orphans", "delete", str(row["id"]))
    assert missing.exit_code == 1 and "error" in missing.output.lower()
