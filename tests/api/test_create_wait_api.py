"""POST /v1/clusters with ``wait_for_ready`` answers once the cluster has settled,
as a start with it does; how long a caller waits is no part of an Idempotency-Key's
request. Real app over HTTP, fake runtime."""

from __future__ import annotations

from typing import Any

from tests.helpers import LiveServer

BODY = {"gpu_type": "NVIDIA RTX A6000", "gpu_count": 1, "docker_image": "img:1"}


def test_a_create_that_waits_answers_the_running_cluster(
    srv: LiveServer, fake_runtime: Any
) -> None:
    fake_runtime.ensure_image("img:1")
    with srv.client() as c:
        r = c.post("/v1/clusters", json={**BODY, "wait_for_ready": True, "timeout_minutes": 2})
        assert r.status_code == 201, r.text
        assert r.json()["data"]["status"] == "running"
        assert r.json()["meta"]["wait_for_ready"] is True
        assert r.json()["meta"]["wait_timed_out"] is False
        plain = c.post("/v1/clusters", json=BODY)
        assert plain.status_code == 201
        assert plain.json()["data"]["status"] in ("pending", "starting", "running")
        assert "wait_for_ready" not in plain.json()["meta"]


def test_a_create_that_fails_to_start_answers_its_error(srv: LiveServer, fake_runtime: Any) -> None:
    fake_runtime.fail_image("broken:1")
    with srv.client() as c:
        r = c.post(
            "/v1/clusters", json={**BODY, "docker_image": "broken:1", "wait_for_ready": True}
        )
        assert r.status_code == 201, r.text
        assert r.json()["data"]["status"] == "error"


def test_the_wait_is_no_part_of_an_idempotency_key(srv: LiveServer, fake_runtime: Any) -> None:
    fake_runtime.ensure_image("img:1")
    with srv.client() as c:
        key = {"Idempotency-Key": "create-wait-1"}
        first = c.post("/v1/clusters", json=BODY, headers=key)
        again = c.post("/v1/clusters", json={**BODY, "wait_for_ready": True}, headers=key)
        assert first.status_code == again.status_code == 201, again.text
        assert again.json()["data"]["id"] == first.json()["data"]["id"]
        assert again.headers.get("Idempotent-Replayed") == "true"
        assert again.json()["data"]["status"] == "running"


def test_a_wait_given_wrongly_is_refused_in_the_envelope(srv: LiveServer) -> None:
    with srv.client() as c:
        for bad in ({"wait_for_ready": "yes"}, {"timeout_minutes": 31}, {"timeout_minutes": 0}):
            r = c.post("/v1/clusters", json={**BODY, **bad})
            assert r.status_code in (400, 422), r.text
            assert r.json()["success"] is False
        assert c.get("/v1/clusters").json()["data"]["clusters"] == []
