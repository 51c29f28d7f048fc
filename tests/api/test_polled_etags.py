"""The reads the console polls answer with an ``ETag`` and ``304`` (api/http/conditional.py,
api/fast/fastpath.py), over real HTTP: the first answer carries the tag; the same request
with ``If-None-Match: <tag>`` is a 304 with the same tag and no body; a change gives a
new tag and a 200; a tag of something else gives a 200; an error is never a 304.

Polled: ``GET /v1/hosts`` and ``GET /v1/orphans`` (hosts page), ``GET /v1/clusters/{id}``
and its ``/events`` (cluster page), the training list, cluster and events (training
pages). ``GET /v1/clusters`` is tested in test_cluster_read_cache.py.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpuyard.testing.fake_runtime import FakeRuntime
from tests.api.test_orphans import _quarantine
from tests.api.test_training_api import BASE as TRAINING
from tests.api.test_training_api import body as training_body
from tests.api.test_training_api import params as training_params
from tests.api.test_training_api import public_key
from tests.helpers import LiveServer, live_server, make_settings, v1_error

CLUSTER = {
    "gpu_type": "NVIDIA RTX A6000",
    "gpu_count": 1,
    "docker_image": "localhost/gpuyard/busybox:latest",
    "volume_gb": 1,
}
FOREIGN = '"not-this-one"'


@pytest.fixture
def quiet(tmp_path: Path, fake_runtime: FakeRuntime) -> Iterator[LiveServer]:
    """A server whose engines are heartbeaten once, at start, and then an hour apart
    (nothing a host shows changes unless the test changes it), and whose rendered
    cluster answers are kept while nothing is written (api/fast/view_cache.py), so that a
    running cluster's accruing cost does not change its answer between two polls."""
    settings = make_settings(tmp_path / "home", heartbeat_interval_s=3600)
    with live_server(settings, fake_runtime) as server:
        server.server.app.state.gpuyard.views.max_age_s = 600.0
        yield server


def settled_etag(
    c: httpx.Client,
    path: str,
    params: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
) -> str:
    """The ``ETag`` of ``path`` once two answers in a row carry the same one (what the
    background work at start-up changes, such as the first heartbeat, has landed)."""
    deadline = time.monotonic() + 10
    last = None
    while True:
        r = c.get(path, params=params, headers=headers)
        assert r.status_code == 200, r.text
        etag = r.headers["etag"]
        assert etag.startswith('"') and etag.endswith('"')
        if etag == last:
            return etag
        assert time.monotonic() < deadline, f"{path}: the ETag never settled"
        last = etag
        time.sleep(0.05)


def assert_not_modified(
    c: httpx.Client,
    path: str,
    etag: str,
    params: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
) -> None:
    """``If-None-Match: etag`` (and the weak form, and with another tag in a list)
    answers 304 with the same ``ETag`` and no body; a foreign tag answers 200."""
    for named in (etag, f"W/{etag}", f"{FOREIGN}, {etag}"):
        r = c.get(path, params=params, headers={**(headers or {}), "If-None-Match": named})
        assert r.status_code == 304, (named, r.status_code, r.text)
        assert r.headers["etag"] == etag
        assert r.content == b""
    other = c.get(path, params=params, headers={**(headers or {}), "If-None-Match": FOREIGN})
    assert other.status_code == 200, other.text
    assert other.headers["etag"] == etag
    assert other.json()  # a whole answer


def assert_changed(
    c: httpx.Client,
    path: str,
    etag: str,
    params: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    """The old tag no longer matches: a 200 with a new ``ETag`` and the body."""
    r = c.get(path, params=params, headers={**(headers or {}), "If-None-Match": etag})
    assert r.status_code == 200, r.text
    assert r.headers["etag"] != etag
    return r


def test_hosts_answer_304_until_a_host_is_cordoned(quiet: LiveServer) -> None:
    with quiet.client() as c:
        etag = settled_etag(c, "/v1/hosts")
        first = c.get("/v1/hosts")
        assert first.json()["success"] is True
        assert_not_modified(c, "/v1/hosts", etag)
        [host] = first.json()["data"]["hosts"]
        assert c.post(f"/v1/hosts/{host['id']}/cordon").status_code == 200
        changed = assert_changed(c, "/v1/hosts", etag)
        assert changed.json()["data"]["hosts"][0]["status"] == "cordoned"
        assert changed.json()["meta"]["request_id"]
        # Back as it was: the same data, the same tag.
        assert c.post(f"/v1/hosts/{host['id']}/uncordon").status_code == 200
        assert c.get("/v1/hosts", headers={"If-None-Match": etag}).status_code == 304


def test_an_error_is_never_304(quiet: LiveServer) -> None:
    with quiet.client() as c:
        etag = settled_etag(c, "/v1/hosts")
        with quiet.client("not-a-key") as stranger:
            r = stranger.get("/v1/hosts", headers={"If-None-Match": etag})
        v1_error(r, 401, "UNAUTHORIZED")
        assert "etag" not in r.headers
        # ``*`` matches any tag, but there is nothing to match.
        missing = c.get("/v1/clusters/nosuchcluster", headers={"If-None-Match": "*"})
        v1_error(missing, 404, "CLUSTER_NOT_FOUND")
        assert "etag" not in missing.headers


def test_orphans_answer_304_until_one_is_deleted(
    quiet: LiveServer, fake_runtime: FakeRuntime
) -> None:
    _quarantine(quiet, fake_runtime, "lostcluster009")
    with quiet.client() as c:
        etag = settled_etag(c, "/v1/orphans")
        assert_not_modified(c, "/v1/orphans", etag)
        (row,) = c.get("/v1/orphans").json()["data"]["orphans"]
        assert c.delete(f"/v1/orphans/{row['id']}").status_code == 200
        assert assert_changed(c, "/v1/orphans", etag).json()["data"]["orphans"] == []


def test_a_cluster_and_its_events_answer_304_until_it_changes(quiet: LiveServer) -> None:
    with quiet.client() as c:
        r = c.post("/v1/clusters", json={"name": "polled", **CLUSTER})
        assert r.status_code == 201, r.text
        cid = r.json()["data"]["id"]
        assert quiet.server.reconciler.wait_idle(10)
        account = c.get("/v1/me").json()["data"]["acting"]["account_id"]
        one = f"/v1/clusters/{cid}"
        events = f"/v1/clusters/{cid}/events"
        page = {"per_page": "50"}
        # The middleware answers a plain request; one that selects the account takes
        # the route (api/fast/fastpath.py): both tag alike.
        routed = {"X-Gpuyard-Account": str(account)}
        etag = settled_etag(c, one)
        assert_not_modified(c, one, etag)
        assert settled_etag(c, one, headers=routed) == etag
        assert_not_modified(c, one, etag, headers=routed)
        events_etag = settled_etag(c, events, page)
        assert_not_modified(c, events, events_etag, page)

        assert c.post(f"{one}/stop").status_code == 200
        assert quiet.server.reconciler.wait_idle(10)
        assert assert_changed(c, one, etag).json()["data"]["status"] == "stopped"
        assert_changed(c, one, etag, headers=routed)
        assert_changed(c, events, events_etag, page)


def test_training_reads_answer_304_until_the_cluster_goes(
    quiet: LiveServer, tmp_path: Path
) -> None:
    with quiet.client() as c:
        key = c.post(
            "/v1/ssh-keys", json={"name": "me", "public_key": public_key(tmp_path, "k1")}
        ).json()["data"]
        image = c.get("/v1/images").json()["data"]["images"][0]
        project = c.get("/v1/projects").json()["data"]["projects"][0]
        setup = {"key_id": key["id"], "image_id": image["id"], "project_id": project["id"]}
        scope = training_params(setup)
        r = c.post(TRAINING, params=scope, json=training_body(setup))
        assert r.status_code == 201, r.text
        one = f"{TRAINING}{r.json()['data']['id']}/"
        paths = {
            "list": (TRAINING, {**scope, "per_page": "100"}),
            "one": (one, scope),
            "events": (one + "events/", scope),
        }
        etags = {name: settled_etag(c, path, query) for name, (path, query) in paths.items()}
        for name, (path, query) in paths.items():
            assert_not_modified(c, path, etags[name], query)

        assert c.delete(one, params=scope).status_code == 200
        listed = assert_changed(c, TRAINING, etags["list"], paths["list"][1]).json()
        assert listed["code"] == 200 and listed["data"] == []
        # Gone: the 404 in the seed's envelope, never a 304 for the tag it had.
        gone = c.get(one, params=scope, headers={"If-None-Match": etags["one"]})
        assert gone.status_code == 404 == gone.json()["code"]
        assert "etag" not in gone.headers
