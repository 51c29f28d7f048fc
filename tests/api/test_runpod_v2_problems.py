"""RunPod's REST v2 answers every error as RFC 9457 problem details
(api/http/problems.py), whoever answers it: a route's exception, routing (404), or a
middleware ahead of routing (NUL guard, body limit, rate limit), while /v1 keeps its
envelope for the same failures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
from fastapi.testclient import TestClient

from gpuyard.api.app import build_server
from gpuyard.api.http.problems import PROBLEM_MEDIA_TYPE, RUNPOD_V2_PREFIX
from gpuyard.services.clock import FakeClock
from gpuyard.testing.fake_runtime import FakeRuntime
from tests.api.test_rate_limits import OFF
from tests.helpers import LiveServer, make_settings

V2 = RUNPOD_V2_PREFIX


def problem(r: httpx.Response, status: int, code: str) -> dict[str, Any]:
    """The problem document of ``r``, checked: status, media type, RFC 9457 members."""
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith(PROBLEM_MEDIA_TYPE), r.headers
    body: dict[str, Any] = r.json()
    assert body["status"] == status
    assert body["code"] == code
    assert body["type"] == f"urn:gpuyard:error:{code.lower()}"
    assert isinstance(body["title"], str) and body["title"]
    assert isinstance(body["detail"], str) and body["detail"]
    assert isinstance(body["errors"], list)
    assert all(isinstance(e, str) for e in body["errors"])
    return body


def test_an_unknown_v2_path_is_a_404_problem_and_v1_keeps_its_envelope(srv: LiveServer) -> None:
    with srv.client() as c:
        body = problem(c.get(f"{V2}/no-such-thing"), 404, "NOT_FOUND")
        assert body["title"] == "Not Found"
        v1 = c.get("/v1/no-such-thing")
        assert v1.status_code == 404
        assert v1.json()["success"] is False


def test_middleware_refusals_on_v2_are_problems(srv: LiveServer) -> None:
    with srv.client() as c:
        body = problem(c.get(f"{V2}/pods", params={"name": "a\x00b"}), 400, "VALIDATION_ERROR")
        assert body["errors"] == ["name"]
        big = b"x" * (srv.server.ctx.settings.max_body_bytes + 1)
        problem(c.post(f"{V2}/pods", content=big), 413, "PAYLOAD_TOO_LARGE")


def test_a_rate_limited_v2_request_is_a_429_problem_with_retry_after(tmp_path: Path) -> None:
    clock = FakeClock()
    settings = make_settings(
        tmp_path / "home", **{**OFF, "rate_limit_per_key": 1, "rate_limit_key_burst": 1}
    )
    server = build_server(settings, FakeRuntime(), run_reconciler=False, rate_limit_clock=clock)
    assert server.admin_key is not None
    headers = {"Authorization": f"Bearer {server.admin_key.key}"}
    with TestClient(server.app, client=("203.0.113.5", 40000), headers=headers) as c:
        c.get(f"{V2}/no-such-thing")
        refused = c.get(f"{V2}/no-such-thing")
        body = problem(refused, 429, "RATE_LIMITED")
        assert refused.headers["retry-after"] == "1"
        assert "retry after 1 s" in body["detail"]
