"""A cluster stored with an image whose registry is not (or no longer) allowed never
makes the engine pull from it: its start fails naming the registry, before any pull.

Real database, fake runtime (counts its calls)."""

from __future__ import annotations

from gpuyard.reconciler.loop import Reconciler
from gpuyard.services.clusters import use_cases as uc
from gpuyard.services.clusters.requests import StartCluster
from gpuyard.services.context import Context
from gpuyard.services.tenancy.auth import Principal
from gpuyard.store.schema import Cluster
from gpuyard.testing.fake_runtime import FakeRuntime
from tests.service.test_lifecycle import a6000, settle


def test_a_stored_image_from_a_refused_registry_is_never_pulled(
    ctx: Context, alice: Principal, rec: Reconciler, runtime: FakeRuntime
) -> None:
    c = uc.create_cluster(ctx, alice, a6000(1))
    settle(rec, c.id)
    assert uc.stop_cluster(ctx, alice, c.id).status in ("stopping", "stopped")
    settle(rec, c.id)
    # Stored before the allow-list (or the operator narrowed it since).
    with ctx.transaction() as s:
        row = s.get(Cluster, c.id)
        assert row is not None
        row.image = "127.0.0.1:8765/probe"
    pulls = runtime.calls.get("ensure_image", 0)
    uc.start_cluster(ctx, alice, c.id, StartCluster())
    settle(rec, c.id)
    got = uc.get_cluster(ctx, alice, c.id)
    assert got.status == "error"
    assert "registry '127.0.0.1:8765'" in (got.error_message or "")
    assert runtime.calls.get("ensure_image", 0) == pulls
