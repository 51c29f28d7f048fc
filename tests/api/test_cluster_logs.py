"""``GET /v1/clusters/{id}/logs`` over real HTTP with the fake runtime: the JSON list,
its limits and refusals, resuming by cursor, the SSE follow, archives across stop,
restart and terminate, and who may read what."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

from gpuyard.api.rest.cluster_logs import LogListEnvelope
from gpuyard.core.tls_trust import trusted_tls
from gpuyard.services.tenancy.auth import Scope, create_account, issue_key, resolve_key
from gpuyard.store.schema import ClusterLogArchive
from gpuyard.testing.fake_runtime import FakeRuntime
from tests.api.sse import Event, events
from tests.helpers import LiveServer, created, refused

BODY = {"gpu_type": "NVIDIA RTX A6000", "docker_image": "img", "volume_gb": 1}


def act(srv: LiveServer, c: httpx.Client, cid: str, action: str) -> None:
    r = (
        c.delete(f"/v1/clusters/{cid}")
        if action == "terminate"
        else c.post(f"/v1/clusters/{cid}/{action}")
    )
    assert r.status_code == 200, r.text
    assert srv.server.reconciler.wait_idle(10)


def logs(c: httpx.Client, cid: str, **params: Any) -> dict[str, Any]:
    r = c.get(f"/v1/clusters/{cid}/logs", params=params)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    LogListEnvelope.model_validate(body)
    return body


def texts(body: dict[str, Any], source: str = "container") -> list[str]:
    return [e["line"] for e in body["data"] if e["source"] == source]


def say(rt: FakeRuntime, cid: str, *lines: str) -> None:
    rt.containers[cid].log_lines.extend(lines)


def archives(srv: LiveServer, cid: str) -> int:
    with srv.server.ctx.read() as s:
        q = select(func.count()).where(ClusterLogArchive.cluster_id == cid)
        return int(s.scalar(q) or 0)


def test_json_list_merges_container_and_system_lines(
    srv: LiveServer, fake_runtime: FakeRuntime
) -> None:
    with srv.client() as c:
        cid = created(srv, c, BODY)
        say(fake_runtime, cid, "hello", "world")
        body = logs(c, cid)
        assert body["success"] is True
        assert texts(body) == [f"started {cid}", "hello", "world"]
        system = texts(body, "system")
        assert "status: starting -> running (running)" in system
        # The image was not on the engine: its pull is told, before the start.
        pulling = system.index("pull: pulling image img")
        pulled = next(i for i, t in enumerate(system) if t.startswith("pull: pulled image img in"))
        assert pulling < pulled < system.index("status: starting -> running (running)")
        assert all(set(e) == {"id", "source", "line", "ts"} for e in body["data"])
        stamps = [e["ts"] for e in body["data"]]
        assert all(ts.endswith("Z") for ts in stamps)
        assert body["meta"]["cursor"] == body["data"][-1]["id"]
        assert body["meta"]["status"] == "running" and body["meta"]["container_error"] is None
        ids = [e["id"] for e in body["data"]]
        assert len(set(ids)) == len(ids)


def test_tail_limits_and_bad_input_answer_400(srv: LiveServer, fake_runtime: FakeRuntime) -> None:
    with srv.client() as c:
        cid = created(srv, c, BODY)
        say(fake_runtime, cid, *[f"l{i}" for i in range(20)])
        assert len(logs(c, cid, tail=5)["data"]) == 5
        assert len(logs(c, cid, tail=5000)["data"]) > 20
        empty = logs(c, cid, tail=0)
        assert empty["data"] == [] and empty["meta"]["cursor"]
        url = f"/v1/clusters/{cid}/logs"
        for params, field in (
            ({"tail": 5001}, "tail"),
            ({"tail": -1}, "tail"),
            ({"tail": "ten"}, "tail"),
            ({"since": "yesterday"}, "since"),
            ({"since": "2026-02-30T00:00:00Z"}, "since"),
            ({"after": "12"}, "after"),
            ({"follow": "maybe"}, "follow"),
        ):
            refused(c.get(url, params=params), field)
        refused(c.get(url, headers={"Last-Event-ID": "nope"}), "Last-Event-ID")
        refused(c.get(url, params={"follow": "true", "tail": 6000}), "tail")


def test_since_filters_by_time(srv: LiveServer, fake_runtime: FakeRuntime) -> None:
    with srv.client() as c:
        cid = created(srv, c, BODY)
        say(fake_runtime, cid, "x")
        assert texts(logs(c, cid, since="1d")) == [f"started {cid}", "x"]
        assert logs(c, cid, since="2999-01-01T00:00:00Z")["data"] == []
        assert logs(c, cid, since="0")["data"] == logs(c, cid)["data"]


def test_after_resumes_without_loss_or_duplicates(
    srv: LiveServer, fake_runtime: FakeRuntime
) -> None:
    with srv.client() as c:
        cid = created(srv, c, BODY)
        # Many lines share one stamp (the fake stamps to the second, as Podman does).
        say(fake_runtime, cid, *[f"l{i}" for i in range(40)])
        everything = logs(c, cid, tail=5000)["data"]
        got: list[dict[str, Any]] = []
        cursor = "0-0-0"
        while True:
            page = logs(c, cid, after=cursor, tail=7)
            got += page["data"]
            cursor = page["meta"]["cursor"]
            if not page["meta"]["more"]:
                break
        assert got == everything
        # Lines written later come after the last cursor, once.
        say(fake_runtime, cid, "late")
        assert texts(logs(c, cid, after=cursor)) == ["late"]
        assert logs(c, cid, after=logs(c, cid)["meta"]["cursor"])["data"] == []
        # Last-Event-ID says the same as after.
        r = c.get(f"/v1/clusters/{cid}/logs", headers={"Last-Event-ID": cursor})
        assert [e["line"] for e in r.json()["data"]] == ["late"]


def test_logs_outlive_stop_and_restart_until_terminate(
    srv: LiveServer, fake_runtime: FakeRuntime
) -> None:
    with srv.client() as c:
        cid = created(srv, c, BODY)
        say(fake_runtime, cid, "before stop")
        act(srv, c, cid, "stop")
        assert cid not in fake_runtime.containers  # stop removed the container...
        stopped = logs(c, cid)
        assert "before stop" in texts(stopped)  # ...its output was kept
        assert stopped["meta"]["status"] == "stopped"
        act(srv, c, cid, "start")
        say(fake_runtime, cid, "second run")
        act(srv, c, cid, "restart")
        say(fake_runtime, cid, "third run")
        lines = texts(logs(c, cid))
        assert lines == [
            f"started {cid}",
            "before stop",
            f"started {cid}",
            "second run",
            f"started {cid}",
            "third run",
        ]
        assert archives(srv, cid) == 2
        act(srv, c, cid, "terminate")
        # Terminated: the containers' output is gone, the events stay.
        after = logs(c, cid)
        assert texts(after) == []
        assert any("terminated" in line for line in texts(after, "system"))
        assert archives(srv, cid) == 0


def test_a_crashed_containers_output_is_kept_when_it_is_brought_back(
    srv: LiveServer, fake_runtime: FakeRuntime
) -> None:
    with srv.client() as c:
        cid = created(srv, c, BODY)
        say(fake_runtime, cid, "about to crash")
        fake_runtime.crash(cid, exit_code=3)
        deadline = time.monotonic() + 15
        while c.get(f"/v1/clusters/{cid}").json()["data"].get("restarts", 0) < 1:
            assert time.monotonic() < deadline, "the cluster was not brought back"
            time.sleep(0.1)
        say(fake_runtime, cid, "back again")
        body = logs(c, cid)
        assert texts(body) == [f"started {cid}", "about to crash", f"started {cid}", "back again"]
        assert any(line.startswith("restart: ") for line in texts(body, "system"))


def read_key(srv: LiveServer) -> str:
    with srv.server.ctx.read() as session:
        admin = resolve_key(session, srv.key)
    with srv.server.ctx.transaction() as session:
        return issue_key(
            session, user_id=admin.user_id, account_id=admin.account_id, name="r", scope=Scope.READ
        ).key


def test_another_account_gets_404_and_a_read_key_is_enough(srv: LiveServer) -> None:
    with srv.client() as c:
        cid = created(srv, c, BODY)
    with srv.server.ctx.transaction() as session:
        user, account, _ = create_account(session, email="eve@example.com", name="eve")
        eve = issue_key(
            session, user_id=user.id, account_id=account.id, name="k", scope=Scope.ADMIN
        )
    with srv.client(eve.key) as c:
        for params in ({}, {"follow": "true"}, {"after": "0-0-0"}):
            r = c.get(f"/v1/clusters/{cid}/logs", params=params)
            assert r.status_code == 404, r.text
            assert r.json()["error"]["code"] == "CLUSTER_NOT_FOUND"
        assert c.get("/v1/clusters/nosuchcluster1/logs").status_code == 404
    with srv.client(read_key(srv)) as c:
        assert c.get(f"/v1/clusters/{cid}/logs").status_code == 200
    assert httpx.get(f"{srv.url}/v1/clusters/{cid}/logs", verify=trusted_tls()).status_code == 401


def open_follow(
    c: httpx.Client, cid: str, headers: dict[str, str] | None = None, **params: Any
) -> Any:
    return c.stream(
        "GET",
        f"/v1/clusters/{cid}/logs",
        params={"follow": "true", **params},
        headers=headers or {},
    )


def until(stream: Any, want: str) -> list[Event]:
    """Events up to and including the first whose line is ``want``."""
    seen = []
    for event in stream:
        seen.append(event)
        if event.event == "message" and event.json["line"] == want:
            return seen
    raise AssertionError(f"stream ended before {want!r}: {seen}")


def test_follow_streams_new_lines_and_resumes_with_last_event_id(
    srv: LiveServer, fake_runtime: FakeRuntime
) -> None:
    with httpx.Client(
        base_url=srv.url,
        headers={"Authorization": f"Bearer {srv.key}"},
        timeout=10,
        verify=trusted_tls(),
    ) as c:
        cid = created(srv, c, BODY)
        say(fake_runtime, cid, "old")
        with open_follow(c, cid, tail=1) as r:
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            stream = events(r)
            first = next(stream)
            assert first.json["source"] in ("container", "system") and first.id
            say(fake_runtime, cid, "new 1", "new 2")
            seen = until(stream, "new 2")
            assert [e.json["line"] for e in seen][-2:] == ["new 1", "new 2"]
            last = seen[-1].id
        assert last is not None
        # Written while nobody listened: a reconnect gets exactly those.
        say(fake_runtime, cid, "gap 1", "gap 2")
        with open_follow(c, cid, headers={"Last-Event-ID": last}) as r:
            stream = events(r)
            seen = until(stream, "gap 2")
        assert [e.json["line"] for e in seen if e.json["source"] == "container"] == [
            "gap 1",
            "gap 2",
        ]


def test_follow_sees_stop_start_and_ends_on_terminate(
    srv: LiveServer, fake_runtime: FakeRuntime
) -> None:
    with httpx.Client(
        base_url=srv.url,
        headers={"Authorization": f"Bearer {srv.key}"},
        timeout=15,
        verify=trusted_tls(),
    ) as c:
        cid = created(srv, c, BODY)
        # The driver's steps wait on what the stream has delivered, not on sleeps: it
        # starts once the first page came (its cursor is fixed, so "first run" comes
        # after it), and terminates once "second run" was sent (terminate removes the
        # container, and a terminated cluster keeps only its events).
        second_sent = threading.Event()
        failures: list[Exception] = []

        def drive() -> None:
            try:
                with srv.client() as d:
                    try:
                        say(fake_runtime, cid, "first run")
                        act(srv, d, cid, "stop")
                        act(srv, d, cid, "start")
                        say(fake_runtime, cid, "second run")
                        assert second_sent.wait(30), "the stream never sent 'second run'"
                    finally:
                        # Ends the stream whatever happened above.
                        act(srv, d, cid, "terminate")
            except Exception as exc:  # raised again below, on the test's thread
                failures.append(exc)

        driver = threading.Thread(target=drive)
        seen: list[Event] = []
        with open_follow(c, cid, tail=1) as r:
            stream = events(r)
            seen.append(next(stream))  # the first page (tail=1: one entry)
            driver.start()
            for event in stream:
                seen.append(event)
                if event.event == "message" and event.json["line"] == "second run":
                    second_sent.set()
        driver.join(30)
        assert not driver.is_alive()
        if failures:
            raise failures[0]
        assert seen[-1].event == "end"
        lines = [e.json["line"] for e in seen[:-1]]
        assert lines.count("first run") == 1 and lines.count("second run") == 1
        assert lines.index("first run") < lines.index("second run")
        assert any("-> stopped" in line for line in lines)
        ids = [e.id for e in seen[:-1]]
        assert len(set(ids)) == len(ids)
        # Resuming a finished stream: 204 tells EventSource clients to stop.
        r = c.get(
            f"/v1/clusters/{cid}/logs",
            params={"follow": "true"},
            headers={"Last-Event-ID": str(ids[-1])},
        )
        assert r.status_code == 204


def test_no_api_key_in_the_server_log_or_the_lines(
    srv: LiveServer, fake_runtime: FakeRuntime, caplog: pytest.LogCaptureFixture
) -> None:
    # The server's loggers (this test's own HTTP client logs its URLs, key included).
    for name in ("gpuyard", "uvicorn", "sse_starlette", "starlette", "fastapi"):
        caplog.set_level(logging.DEBUG, logger=name)
    with srv.client() as c:
        cid = created(srv, c, BODY)
        say(fake_runtime, cid, "hi")
    with httpx.Client(base_url=srv.url, timeout=10, verify=trusted_tls()) as bare:
        r = bare.get(f"/v1/clusters/{cid}/logs", params={"api_key": srv.key})
        assert r.status_code == 200 and srv.key not in r.text
        with bare.stream(
            "GET", f"/v1/clusters/{cid}/logs", params={"api_key": srv.key, "follow": "true"}
        ) as s:
            seen = until(events(s), "hi")
        assert srv.key not in str([e.data for e in seen])
    server_log = [
        r.getMessage() for r in caplog.records if not r.name.startswith(("httpx", "httpcore"))
    ]
    assert server_log and srv.key not in "\n".join(server_log)


def test_openapi_documents_json_and_event_stream(srv: LiveServer) -> None:
    doc = httpx.get(srv.url + "/openapi.json", timeout=60, verify=trusted_tls()).json()
    op = doc["paths"]["/v1/clusters/{cluster_id}/logs"]["get"]
    content = op["responses"]["200"]["content"]
    assert {"application/json", "text/event-stream"} <= set(content)
    names = {p["name"] for p in op["parameters"]}
    assert {"tail", "since", "follow", "after", "Last-Event-ID"} <= names
    tail = next(p for p in op["parameters"] if p["name"] == "tail")["schema"]
    assert (tail["minimum"], tail["maximum"]) == (0, 5000)
