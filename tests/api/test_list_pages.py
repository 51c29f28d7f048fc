"""Keyset pages of the lists over real HTTP: a cursor walk shows every row exactly
once, in order, while rows are added between pages; bad cursors get the v1 envelope's
400 naming ``cursor``; the seed's offset pages keep working."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import httpx
from click.testing import CliRunner
from sqlalchemy import insert

from gpuyard.api.rest.schemas import responses as schemas
from gpuyard.api.rest.snapshots import SnapshotListEnvelope
from gpuyard.cli.main import cli
from gpuyard.core.ids import new_snapshot_id
from gpuyard.store.schema import Event, Project, Snapshot, TrainingCluster
from tests.cluster_rows import T0, seed_clusters
from tests.helpers import LiveServer, refused


def project_id(c: httpx.Client) -> int:
    data = c.get("/v1/projects").json()["data"]
    projects = data if isinstance(data, list) else data["projects"]
    return int(projects[0]["id"])


def walk(c: httpx.Client, path: str, items: str, between: Any = None, **params: Any) -> list[Any]:
    """Every page of ``path`` by cursor: the ids of ``items`` in the order given
    (``between()`` runs after each page)."""
    seen: list[Any] = []
    cursor = None
    while True:
        query = {**params, **({"cursor": cursor} if cursor else {})}
        r = c.get(path, params=query)
        assert r.status_code == 200, r.text
        data = r.json()["data"]
        seen += [x["id"] for x in data[items]]
        cursor = data["pagination"]["next_cursor"]
        if cursor is None:
            return seen
        if between is not None:
            between()


def test_cursor_walk_of_120_clusters_while_more_are_created(srv: LiveServer) -> None:
    with srv.client() as c:
        ids = seed_clusters(srv.server.ctx, project_id(c), 120, "stopped")
        made: list[str] = []

        def create() -> None:
            r = c.post("/v1/clusters", json={"docker_image": "img", "gpu_count": 0})
            assert r.status_code == 201, r.text
            made.append(r.json()["data"]["id"])

        seen = walk(c, "/v1/clusters", "clusters", between=create, per_page=50)
        assert seen == list(reversed(ids))  # newest first, each once; new ones not mixed in
        assert len(made) == 2  # three pages
        first = c.get("/v1/clusters", params={"per_page": 50})
        page = schemas.ClusterListEnvelope.model_validate(first.json()).data
        assert page.pagination.total == 122 and page.pagination.pages == 3
        assert [x.id for x in page.clusters[:2]] == list(reversed(made))
        # The seed's offset pages: page 3 holds the 22 oldest.
        third = c.get("/v1/clusters", params={"per_page": 50, "page": 3}).json()["data"]
        assert [x["id"] for x in third["clusters"]] == list(reversed(ids))[-22:]
        assert third["pagination"]["next_cursor"] is None


def test_bad_cursors_get_400_naming_cursor(srv: LiveServer) -> None:
    with srv.client() as c:
        seed_clusters(srv.server.ctx, project_id(c), 3, "stopped")
        cursor = c.get("/v1/clusters", params={"per_page": 1}).json()["data"]["pagination"][
            "next_cursor"
        ]
        assert cursor
        for params in (
            {"cursor": "garbage!"},
            {"cursor": cursor[:-4]},
            {"cursor": cursor, "status": "terminated"},  # made for other filters
            {"cursor": cursor, "page": 2},
        ):
            refused(c.get("/v1/clusters", params=params), "cursor")
        refused(c.get("/v1/snapshots", params={"cursor": cursor}), "cursor")  # another list
        r = c.get("/v1/clusters", params={"cursor": "x" * 600})
        assert r.status_code == 400 and r.json()["error"]["code"] == "VALIDATION_ERROR"


def test_terminated_clusters_are_listed_only_when_asked(srv: LiveServer) -> None:
    with srv.client() as c:
        pid = project_id(c)
        live = seed_clusters(srv.server.ctx, pid, 4, "stopped")
        gone = seed_clusters(srv.server.ctx, pid, 7, "terminated", start=T0 + timedelta(days=1))
        assert walk(c, "/v1/clusters", "clusters", per_page=3) == list(reversed(live))
        ended = walk(c, "/v1/clusters", "clusters", per_page=3, status="terminated")
        assert ended == list(reversed(gone))
        data = c.get("/v1/clusters", params={"status": "terminated"}).json()["data"]
        assert data["pagination"]["total"] == 7


def test_cursor_walk_of_a_clusters_events(srv: LiveServer) -> None:
    with srv.client() as c:
        [cid] = seed_clusters(srv.server.ctx, project_id(c), 1, "stopped")
        rows = [
            {"cluster_id": cid, "type": "note", "message": f"m{i}", "created_at": T0}
            for i in range(120)
        ]
        with srv.server.ctx.transaction() as session:
            session.execute(insert(Event), rows)
        path = f"/v1/clusters/{cid}/events"
        seen = walk(c, path, "events", per_page=50)
        assert len(seen) == 120 and seen == sorted(seen)
        # A client that never pages gets every event, as before the list was paged;
        # one that pages without a size gets 50.
        unpaged = c.get(path).json()["data"]
        assert [e["id"] for e in unpaged["events"]] == seen
        assert unpaged["pagination"]["next_cursor"] is None
        assert len(c.get(path, params={"page": 1}).json()["data"]["events"]) == 50
        r = c.get(path, params={"per_page": 50, "page": 3})
        assert [e["id"] for e in r.json()["data"]["events"]] == seen[100:]
        schemas.EventListEnvelope.model_validate(r.json())
        refused(c.get(path, params={"cursor": "nope"}), "cursor")
        [other] = seed_clusters(srv.server.ctx, project_id(c), 1, "stopped")
        cursor = c.get(path, params={"per_page": 1}).json()["data"]["pagination"]["next_cursor"]
        refused(c.get(f"/v1/clusters/{other}/events", params={"cursor": cursor}), "cursor")


def test_cursor_walk_of_snapshots(srv: LiveServer) -> None:
    with srv.client() as c:
        pid = project_id(c)
        with srv.server.ctx.read() as session:
            project = session.get(Project, pid)
            assert project is not None
            account_id = project.account_id
        rows = [
            {
                "id": new_snapshot_id(),
                "account_id": account_id,
                "project_id": pid,
                "name": f"s{i}",
                "host_id": 1,
                "volume_name": "v",
                "volume_gb": 1,
                "status": "ready",
                "consistency": "crash_consistent",
                "created_at": T0 + timedelta(seconds=i),
            }
            for i in range(7)
        ]
        with srv.server.ctx.transaction() as session:
            session.execute(insert(Snapshot), rows)
        seen = walk(c, "/v1/snapshots", "snapshots", per_page=3)
        assert seen == [r["id"] for r in reversed(rows)]
        SnapshotListEnvelope.model_validate(c.get("/v1/snapshots").json())
        assert walk(c, "/v1/snapshots", "snapshots", per_page=3, status="failed") == []


def test_cursor_walk_of_training_clusters(srv: LiveServer) -> None:
    training = "/distributed_jobs_v2/cluster/"
    with srv.client() as c:
        pid = project_id(c)
        with srv.server.ctx.transaction() as session:
            project = session.get(Project, pid)
            assert project is not None
            rows = [
                {
                    "account_id": project.account_id,
                    "project_id": pid,
                    "location": "local",
                    "name": f"t{i}",
                    "status": "running",
                    "image_version_id": 1,
                    "gpu_type": "NVIDIA RTX A6000",
                    "gpus_per_node": 1,
                    "cpus_per_node": 1,
                    "memory_gb_per_node": 1,
                    "munge_key": "k",
                }
                for i in range(7)
            ]
            session.execute(insert(TrainingCluster), rows)
        scope: dict[str, Any] = {"project_id": pid, "location": "local"}
        seen: list[int] = []
        cursor = None
        while True:
            r = c.get(
                training, params={**scope, "per_page": 3, **({"cursor": cursor} if cursor else {})}
            )
            body = r.json()
            assert r.status_code == 200 == body["code"], body
            seen += [x["id"] for x in body["data"]]  # the seed's list, as before
            assert body["pagination"]["total"] == 7
            cursor = body["pagination"]["next_cursor"]
            if cursor is None:
                break
        assert len(seen) == 7 and seen == sorted(seen)
        unpaged = c.get(training, params=scope).json()
        assert [x["id"] for x in unpaged["data"]] == seen  # every one, as before
        bad = c.get(training, params={**scope, "cursor": "nope"}).json()
        assert bad["code"] == 400 and bad["errors"]["field"] == "cursor"
        other = {**scope, "location": "elsewhere"}
        first = c.get(training, params={**scope, "per_page": 1}).json()["pagination"]
        moved = c.get(training, params={**other, "cursor": first["next_cursor"]}).json()
        assert moved["code"] == 400 and moved["errors"]["field"] == "cursor"
        for per_page in ("0", "501", "x"):
            r = c.get(training, params={**scope, "per_page": per_page}).json()
            assert r["code"] == 400 and r["errors"]["field"] == "per_page"


def test_cli_list_all_and_events_follow_cursors(srv: LiveServer) -> None:
    def run(*args: str) -> Any:
        env = {"GPUYARD_URL": srv.url, "GPUYARD_API_KEY": srv.key}
        env["GPUYARD_HOME"] = str(srv.server.ctx.settings.home)
        result = CliRunner().invoke(cli, list(args), env=env)
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    with srv.client() as c:
        ids = seed_clusters(srv.server.ctx, project_id(c), 520, "stopped")
    assert len(run("clusters", "list", "--json")["clusters"]) == 500
    listed = [x["id"] for x in run("clusters", "list", "--all", "--json")["clusters"]]
    assert listed == list(reversed(ids))
    rows = [{"cluster_id": ids[0], "type": "note", "message": "m", "created_at": T0}] * 510
    with srv.server.ctx.transaction() as session:
        session.execute(insert(Event), rows)
    assert len(run("clusters", "events", ids[0], "--json")["events"]) == 510
