"""``GET /v1/clusters/{id}/metrics``: the utilisation the reconciler sampled, oldest
first, bounded to the last hour; GPU utilisation is null (no data) where no GPU can be
read; another account's cluster is 404; a bad window is 400 naming it."""

from __future__ import annotations

from gpuyard.store.schema import UtilizationSample
from gpuyard.testing.fake_runtime import FakeRuntime
from tests.helpers import LiveServer, account_with_members, created, v1_error


def test_samples_are_served_to_the_owner_only(srv: LiveServer, fake_runtime: FakeRuntime) -> None:
    with srv.client() as c:
        cid = created(srv, c, {"gpu_count": 0, "docker_image": "img", "cpu_cores": 1})
        recorder = srv.server.reconciler.utilization
        recorder.every_s = 0.0  # a sample at each call, not each 30 s
        fake_runtime.cpu_percent = 42.0
        recorder.run()
        r = c.get(f"/v1/clusters/{cid}/metrics?window=1h")
        assert r.status_code == 200, r.text
        data = r.json()["data"]
        assert data["window_s"] == 3600 and data["gpu_data"] is False
        last = data["samples"][-1]
        assert last["cpu_percent"] == 42.0 and last["gpu_percent"] is None
        ats = [s["at"] for s in data["samples"]]
        assert ats == sorted(ats)
        v1_error(c.get(f"/v1/clusters/{cid}/metrics?window=2d"), 400, "VALIDATION_ERROR")
    _, _, keys = account_with_members(srv, "other@example.com", ())
    with srv.client(keys["owner"]) as other:
        r = other.get(f"/v1/clusters/{cid}/metrics")
        assert r.status_code == 404 and r.json()["error"]["code"] == "CLUSTER_NOT_FOUND", r.text


def test_samples_older_than_the_window_are_deleted(srv: LiveServer) -> None:
    ctx = srv.server.ctx
    with srv.client() as c:
        cid = created(srv, c, {"gpu_count": 0, "docker_image": "img", "cpu_cores": 1})
    old = ctx.clock.now() - srv.server.reconciler.utilization.keep * 2
    with ctx.transaction() as s:
        s.add(UtilizationSample(cluster_id=cid, at=old, cpu_percent=1.0, memory_percent=1.0))
    recorder = srv.server.reconciler.utilization
    recorder.every_s = 0.0
    recorder.run()
    with ctx.read() as s:
        kept = [r.at for r in s.query(UtilizationSample).filter_by(cluster_id=cid)]
    assert kept and min(kept) > old
