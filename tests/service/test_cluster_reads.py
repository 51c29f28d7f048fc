"""The GET read path: the Core query on every backend, and the direct SQLite reader
giving exactly what the Core query gives."""

from __future__ import annotations

import dataclasses

import pytest

from gpuyard.api.rest.schemas.cluster_json import cluster_v1
from gpuyard.core.errors import ClusterNotFound
from gpuyard.services.clusters import use_cases as uc
from gpuyard.services.clusters import views as cluster_views
from gpuyard.services.clusters.requests import CreateCluster
from gpuyard.services.context import Context
from gpuyard.services.tenancy.auth import Principal
from gpuyard.store.sqlite_reader import reader_for


def make(ctx: Context, p: Principal) -> str:
    body = CreateCluster.model_validate(
        {
            "gpu_type": "NVIDIA RTX A6000",
            "docker_image": "img",
            "env": {"A": "1"},
            "volume_gb": 5,
            "ports": [{"internal_port": 22}, {"internal_port": 8888, "protocol": "http"}],
            "auto_terminate": {"enabled": True, "idle_minutes": 5},
        }
    )
    return uc.create_cluster(ctx, p, body).id


def test_visible_read_and_isolation(ctx: Context, alice: Principal, bob: Principal) -> None:
    cid = make(ctx, alice)
    d = cluster_views.load_visible(ctx, alice.account_id, cid)
    view = cluster_v1(d)
    assert view["id"] == cid and view["env"] == {"A": "1"}
    assert [p["external_port"] > 0 for p in view["ports"]] == [True, True]
    assert view["startup_progress"]["steps_completed"] == 2
    with pytest.raises(ClusterNotFound):
        cluster_views.load_visible(ctx, bob.account_id, cid)


def test_sqlite_reader_matches_core_path(ctx: Context, alice: Principal) -> None:
    reader = reader_for(ctx.settings.effective_database_url)
    if reader is None or not ctx.sessions.kw["bind"].url.drivername.startswith("sqlite"):
        pytest.skip("the direct reader is for SQLite")
    cid = make(ctx, alice)
    core = cluster_v1(cluster_views.load_visible(ctx, alice.account_id, cid))
    fast_ctx = dataclasses.replace(ctx, cluster_reader=reader)
    fast = cluster_v1(cluster_views.load_visible(fast_ctx, alice.account_id, cid))
    assert fast == core
    assert reader("nope", alice.account_id) is None
    assert reader(cid, alice.account_id + 999) is None
