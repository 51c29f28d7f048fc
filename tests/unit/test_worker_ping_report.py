"""What a worker's ping says about its jobs: runpod-python's heartbeat always sends
``runpod_version`` and, while it runs any, ``job_id`` (comma-separated)."""

from __future__ import annotations

from starlette.requests import Request

from gpuyard.api.runpod_v2.serverless_workers import reported_jobs


def _ping(query: bytes) -> Request:
    return Request({"type": "http", "method": "GET", "query_string": query, "headers": []})


def test_a_heartbeat_reports_its_jobs() -> None:
    assert reported_jobs(_ping(b"job_id=a%2Cb&runpod_version=1.12.0")) == {"a", "b"}
    assert reported_jobs(_ping(b"job_id=a,,b,&runpod_version=1.12.0")) == {"a", "b"}


def test_a_heartbeat_with_no_job_reports_none_running() -> None:
    assert reported_jobs(_ping(b"runpod_version=1.12.0")) == frozenset()


def test_a_ping_that_is_no_heartbeat_reports_nothing() -> None:
    assert reported_jobs(_ping(b"")) is None
    assert reported_jobs(_ping(b"job_id=a")) is None
