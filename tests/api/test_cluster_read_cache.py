"""GET /v1/clusters/{id} answers from a briefly kept rendering (api/fast/view_cache.py) only
while nothing it was made from changed, and never past the caller's rights.

The real app over real HTTP. The cache's age limit is raised for these tests (its
``max_age_s``), so that "kept" does not depend on how fast the machine is; a counter on
the server's own cluster reader shows whether a request read the store.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from gpuyard.services.context import ClusterReader, Context
from gpuyard.store.schema import Cluster
from gpuyard.testing.fake_runtime import FakeRuntime
from tests.helpers import LiveServer, live_server, make_settings

CLUSTER = {
    "gpu_type": "NVIDIA RTX A6000",
    "gpu_count": 1,
    "docker_image": "localhost/gpuyard/busybox:latest",
    "volume_gb": 1,
}


class CountingReader:
    """The server's own cluster reader, counting reads."""

    def __init__(self, inner: ClusterReader) -> None:
        self.inner = inner
        self.reads = 0

    def __call__(self, cluster_id: str, account_id: int) -> Cluster | None:
        self.reads += 1
        return self.inner(cluster_id, account_id)


@contextmanager
def counted(ctx: Context) -> Iterator[CountingReader]:
    original = ctx.cluster_reader
    assert original is not None, "a file-backed SQLite store has an accelerated reader"
    reader = CountingReader(original)
    ctx.cluster_reader = reader
    try:
        yield reader
    finally:
        ctx.cluster_reader = original


@pytest.fixture
def kept(tmp_path: Path, fake_runtime: FakeRuntime) -> Iterator[LiveServer]:
    """A server that keeps rendered answers for 10 minutes, and whose engine is
    heartbeaten an hour apart: a heartbeat is a write, and a write between two reads
    would make the second read the store again."""
    settings = make_settings(tmp_path / "home", heartbeat_interval_s=3600)
    with live_server(settings, fake_runtime) as server:
        server.server.app.state.gpuyard.views.max_age_s = 600.0
        yield server


def _create(client: httpx.Client, name: str, **extra: object) -> dict[str, object]:
    r = client.post("/v1/clusters", json={"name": name, **CLUSTER, **extra})
    assert r.status_code == 201, r.text
    created: dict[str, object] = r.json()["data"]
    return created


def test_a_kept_answer_reads_nothing_and_has_its_own_request_id(kept: LiveServer) -> None:
    views = kept.server.app.state.gpuyard.views
    with kept.client() as c:
        cid = _create(c, "kept")["id"]
        assert kept.server.reconciler.wait_idle(60)
        # Background work may still commit now and then (a write between two reads
        # rightly makes the second read again): the pair is judged only when no commit
        # fell between its two reads, and tried again otherwise.
        for _attempt in range(20):
            with counted(kept.server.ctx) as reader:
                views.invalidate()  # the first read of the pair reads the store
                before = views.generation
                first = c.get(f"/v1/clusters/{cid}")
                second = c.get(f"/v1/clusters/{cid}")
                quiet = views.generation == before
            assert first.status_code == second.status_code == 200, (first.text, second.text)
            if quiet:
                assert reader.reads == 1  # the second answer read nothing
                break
        else:
            pytest.fail("a commit fell between every pair of reads")
    one, two = first.json(), second.json()
    assert one["data"] == two["data"] and one["success"] is two["success"] is True
    assert one["meta"]["request_id"] != two["meta"]["request_id"]
    assert second.headers["content-type"] == "application/json"


def test_a_write_shows_in_the_next_answer(kept: LiveServer) -> None:
    with kept.client() as c:
        cid = _create(c, "written")["id"]
        assert kept.server.reconciler.wait_idle(60)
        assert c.get(f"/v1/clusters/{cid}").json()["data"]["status"] == "running"
        r = c.post(f"/v1/clusters/{cid}/stop")
        assert r.status_code == 200, r.text
        # At once, without waiting for the kept answer to age.
        assert c.get(f"/v1/clusters/{cid}").json()["data"]["status"] in ("stopping", "stopped")


def test_a_kept_answer_is_not_given_past_a_keys_project(kept: LiveServer) -> None:
    with kept.client() as admin:
        cid = _create(admin, "default project")["id"]
        assert kept.server.reconciler.wait_idle(60)
        assert admin.get(f"/v1/clusters/{cid}").status_code == 200  # now kept
        r = admin.post("/v1/projects", json={"name": "p2"})
        assert r.status_code == 201, r.text
        body = {"name": "p2 only", "scope": "read", "project_id": r.json()["data"]["id"]}
        r = admin.post("/v1/api-keys", json=body)
        assert r.status_code == 201, r.text
        restricted = r.json()["data"]["key"]
        # The key's creation committed: read the cluster once more, to keep it again.
        assert admin.get(f"/v1/clusters/{cid}").status_code == 200
    with kept.client(restricted) as k:
        r = k.get(f"/v1/clusters/{cid}")
    assert r.status_code == 404, r.text
    assert r.json()["error"]["code"] == "CLUSTER_NOT_FOUND"


def test_another_accounts_cluster_stays_unseen(kept: LiveServer) -> None:
    with kept.client() as admin:
        cid = _create(admin, "mine")["id"]
        assert admin.get(f"/v1/clusters/{cid}").status_code == 200  # now kept
        r = admin.post(
            "/v1/accounts",
            json={"name": "other co", "owner_email": "o@example.com", "owner_name": "O"},
        )
        assert r.status_code == 201, r.text
        stranger = r.json()["data"]["api_key"]["key"]
        assert admin.get(f"/v1/clusters/{cid}").status_code == 200
    with kept.client(stranger) as s:
        r = s.get(f"/v1/clusters/{cid}")
    assert r.status_code == 404, r.text


# -- lists ---------------------------------------------------------------------------


def _names(client: httpx.Client, **params: object) -> list[str]:
    r = client.get("/v1/clusters", params={k: str(v) for k, v in params.items()})
    assert r.status_code == 200, r.text
    return [c["name"] for c in r.json()["data"]["clusters"]]


def test_a_kept_list_shows_a_write_at_once(kept: LiveServer) -> None:
    with kept.client() as c:
        cid = _create(c, "first")["id"]
        assert kept.server.reconciler.wait_idle(60)
        first = c.get("/v1/clusters")
        again = c.get("/v1/clusters")
        # Kept: the same data, each answer with its own request id.
        assert first.json()["data"] == again.json()["data"]
        assert first.json()["meta"]["request_id"] != again.json()["meta"]["request_id"]
        _create(c, "second")
        assert _names(c) == ["second", "first"]
        assert c.post(f"/v1/clusters/{cid}/stop").status_code == 200
        statuses = {x["id"]: x["status"] for x in c.get("/v1/clusters").json()["data"]["clusters"]}
        assert statuses[cid] in ("stopping", "stopped")
        # Each query is its own entry.
        assert _names(c, per_page=1) == ["second"]
        assert _names(c, search="fir") == ["first"]


def test_a_kept_list_is_rendered_for_each_callers_scope(kept: LiveServer) -> None:
    with kept.client() as admin:
        _create(admin, "default project")
        r = admin.post("/v1/projects", json={"name": "p2"})
        assert r.status_code == 201, r.text
        body = {"name": "p2 only", "scope": "read", "project_id": r.json()["data"]["id"]}
        r = admin.post("/v1/api-keys", json=body)
        assert r.status_code == 201, r.text
        restricted = r.json()["data"]["key"]
        r = admin.post(
            "/v1/accounts",
            json={"name": "other co", "owner_email": "o2@example.com", "owner_name": "O"},
        )
        assert r.status_code == 201, r.text
        stranger = r.json()["data"]["api_key"]["key"]
        assert _names(admin) == ["default project"]  # now kept
    with kept.client(restricted) as k:
        assert _names(k) == []
    with kept.client(stranger) as s:
        assert _names(s) == []


def test_an_unchanged_page_answers_304_to_its_etag(kept: LiveServer) -> None:
    with kept.client() as c:
        first = c.get("/v1/clusters")  # read by the route
        etag = first.headers["etag"]
        again = c.get("/v1/clusters", headers={"If-None-Match": etag})  # kept: middleware
        assert again.status_code == 304 and again.headers["etag"] == etag
        assert again.content == b""
        assert c.get("/v1/clusters", headers={"If-None-Match": '"other"'}).status_code == 200
        _create(c, "new")
        changed = c.get("/v1/clusters", headers={"If-None-Match": etag})
        assert changed.status_code == 200 and changed.headers["etag"] != etag
        assert [x["name"] for x in changed.json()["data"]["clusters"]] == ["new"]
