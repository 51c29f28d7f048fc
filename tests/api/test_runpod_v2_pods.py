"""RunPod v2's pods (/runpod/v2/pods) over real HTTP with the fake runtime: every
route's answer held to RunPod's published document (tests/contract/runpod_v2.py),
every action and the statuses it leads to, keyset pages over 120 pods, RFC 9457
problems for bad input, another account's key and a missing key."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpuyard.api.http.problems import PROBLEM_MEDIA_TYPE, RUNPOD_V2_PREFIX
from gpuyard.core.tls_trust import trusted_tls
from gpuyard.testing.fake_runtime import FakeRuntime
from tests.api.sse import events
from tests.api.test_runpod_v2_problems import problem
from tests.contract.runpod_v2 import check_answer
from tests.helpers import LiveServer, account_with_members, live_server, make_settings

V2 = RUNPOD_V2_PREFIX
GPU = "NVIDIA RTX A6000"
BODY: dict[str, Any] = {
    "name": "trainer",
    "image": "img",
    "gpu": {"id": GPU, "count": 1},
    "ports": ["22/tcp", "8888/http"],
    "env": {"MODEL": "llama", "API_TOKEN": "hunter2"},
    "mounts": {"persistent": {"size": 10, "path": "/workspace"}},
    "disk": 20,
}
CPU_BODY: dict[str, Any] = {"name": "cpu", "image": "img", "cpu": {"id": "cpu3c", "vcpuCount": 2}}


def created(srv: LiveServer, c: httpx.Client, body: dict[str, Any] | None = None) -> dict[str, Any]:
    r = c.post(f"{V2}/pods", json=body or BODY)
    assert r.status_code == 201, r.text
    pod: dict[str, Any] = r.json()
    check_answer("POST", "/v2/pods", 201, pod)
    return pod


def settle(srv: LiveServer) -> None:
    assert srv.server.reconciler.wait_idle(10)


def get(c: httpx.Client, pod_id: str) -> dict[str, Any]:
    r = c.get(f"{V2}/pods/{pod_id}")
    assert r.status_code == 200, r.text
    pod: dict[str, Any] = r.json()
    check_answer("GET", "/v2/pods/{id}", 200, pod)
    return pod


def act(c: httpx.Client, pod_id: str, action: str) -> httpx.Response:
    return c.post(f"{V2}/pods/{pod_id}/action", json={"action": action})


def acted(c: httpx.Client, pod_id: str, action: str) -> dict[str, Any]:
    r = act(c, pod_id, action)
    assert r.status_code == 200, r.text
    pod: dict[str, Any] = r.json()
    check_answer("POST", "/v2/pods/{id}/action", 200, pod)
    return pod


def v2_problem(r: httpx.Response, status: int, code: str, path: str, method: str) -> dict[str, Any]:
    body = problem(r, status, code)
    check_answer(method, path, status, body)
    return body


def test_a_created_pod_answers_as_the_document_says_and_runs(srv: LiveServer) -> None:
    with srv.client() as c:
        pod = created(srv, c)
        assert pod["status"] in ("PROVISIONING", "STARTING")
        assert set(pod["actions"]) == {"stop", "terminate"}
        assert pod["runtime"] is None
        assert pod["gpu"] == {"id": GPU, "count": 1}
        assert pod["env"] == {"MODEL": "llama", "API_TOKEN": "********"}
        assert pod["ports"] == ["22/tcp", "8888/http"]
        assert pod["mounts"] == {"persistent": {"size": 10, "path": "/workspace"}}
        assert pod["disk"] == 20 and pod["cloud"] == "SECURE" and pod["locked"] is False
        settle(srv)
        pod = get(c, pod["id"])
        assert pod["status"] == "RUNNING"
        assert pod["actions"] == ["stop", "restart", "terminate"]
        assert pod["dataCenterId"] is not None and pod["startedAt"] is not None
        ports = {p["private"]: p for p in pod["runtime"]["ports"]}
        ssh = ports[22]
        assert ssh["type"] == "tcp" and isinstance(ssh["public"], int) and ssh["ip"]
        # A private http port answers only through the proxy: no public port.
        assert ports[8888]["public"] is None
        direct = pod["ssh"]["direct"]
        assert direct["port"] == ssh["public"] and direct["host"] == ssh["ip"]
        assert direct["username"] == "root"
        assert direct["command"] == f"ssh root@{direct['host']} -p {direct['port']}"
        assert pod["cost"] > 0
        r = c.get(f"{V2}/pods")
        assert r.status_code == 200
        check_answer("GET", "/v2/pods", 200, r.json())
        assert [p["id"] for p in r.json()["pods"]] == [pod["id"]]
        assert "nextCursor" not in r.json()


def test_cpu_pods_mounts_commands_and_spot(srv: LiveServer) -> None:
    with srv.client() as c:
        pod = created(srv, c, {**CPU_BODY, "cmd": ["python", "-c", "print('a b')"]})
        assert "gpu" not in pod
        assert pod["cpu"] == {"id": "cpu", "vcpuCount": 2, "memory": 4}
        assert pod["args"] == "python -c 'print('\"'\"'a b'\"'\"')'"
        spot = created(srv, c, {**BODY, "name": "spot", "interruptible": True, "bidPerGpu": 5.0})
        assert spot["interruptible"] is True and spot["bidPerGpu"] == 5.0
        jupyter = created(srv, c, {**CPU_BODY, "name": "j", "startJupyter": True})
        assert jupyter["env"] == {"JUPYTER_PASSWORD": "********"}
        settle(srv)


def test_every_action_leads_where_the_document_says(srv: LiveServer) -> None:
    with srv.client() as c:
        pod_id = created(srv, c)["id"]
        settle(srv)
        pod = acted(c, pod_id, "stop")
        assert pod["status"] == "EXITED"
        settle(srv)
        pod = get(c, pod_id)
        assert pod["status"] == "EXITED" and pod["runtime"] is None
        assert pod["actions"] == ["start", "terminate"]
        assert pod["ssh"] == {"proxy": None, "direct": None}
        path = "/v2/pods/{id}/action"
        body = v2_problem(act(c, pod_id, "stop"), 409, "INVALID_STATE", path, "POST")
        assert "stop" in body["detail"]
        v2_problem(act(c, pod_id, "restart"), 409, "INVALID_STATE", path, "POST")
        assert acted(c, pod_id, "start")["status"] in ("PROVISIONING", "STARTING")
        settle(srv)
        assert get(c, pod_id)["status"] == "RUNNING"
        assert acted(c, pod_id, "restart")["status"] == "STARTING"
        settle(srv)
        assert get(c, pod_id)["status"] == "RUNNING"
        r = act(c, pod_id, "terminate")
        assert r.status_code == 204 and r.content == b""
        settle(srv)
        pod = get(c, pod_id)
        assert pod["status"] == "TERMINATED" and pod["actions"] == [] and pod["cost"] == 0.0
        v2_problem(act(c, pod_id, "start"), 409, "INVALID_STATE", path, "POST")


def test_delete_terminates_and_the_list_forgets_the_pod(srv: LiveServer) -> None:
    with srv.client() as c:
        pod_id = created(srv, c)["id"]
        settle(srv)
        r = c.delete(f"{V2}/pods/{pod_id}")
        assert r.status_code == 204 and r.content == b""
        settle(srv)
        assert get(c, pod_id)["status"] == "TERMINATED"
        assert c.delete(f"{V2}/pods/{pod_id}").status_code == 204
        assert c.get(f"{V2}/pods").json()["pods"] == []
        gone = c.get(f"{V2}/pods", params={"status": "TERMINATED"}).json()["pods"]
        assert [p["id"] for p in gone] == [pod_id]


def test_patch_renames_at_once_and_restarts_for_container_settings(srv: LiveServer) -> None:
    with srv.client() as c:
        pod_id = created(srv, c)["id"]
        settle(srv)
        path = "/v2/pods/{id}"
        r = c.patch(f"{V2}/pods/{pod_id}", json={"name": "renamed"})
        assert r.status_code == 200, r.text
        check_answer("PATCH", path, 200, r.json())
        assert r.json()["name"] == "renamed" and r.json()["status"] == "RUNNING"
        # The mask sent back keeps the secret; MODEL changes, API_TOKEN stays.
        env = {"MODEL": "mistral", "API_TOKEN": "********", "NEW": "1"}
        r = c.patch(
            f"{V2}/pods/{pod_id}", json={"env": env, "ports": ["22/tcp", "8888/http", "9000/tcp"]}
        )
        assert r.status_code == 200, r.text
        check_answer("PATCH", path, 200, r.json())
        settle(srv)
        pod = get(c, pod_id)
        assert pod["status"] == "RUNNING"
        assert pod["env"] == env
        assert pod["ports"] == ["22/tcp", "8888/http", "9000/tcp"]
        # Nothing of what gpuyard cannot change: 400 naming the field, nothing changed.
        for body, field in (
            ({"disk": 99}, "disk"),
            ({"args": "sleep 1"}, "args"),
            ({"ports": ["22/tcp"]}, "ports"),
            ({"locked": True}, "locked"),
            ({"globalNetworking": True}, "globalNetworking"),
            ({"mounts": {"persistent": {"size": 10, "path": "/data"}}}, "mounts.persistent.path"),
            ({"mounts": {"persistent": {"size": 10, "path": "/workspace"}}, "image": "img"}, None),
        ):
            r = c.patch(f"{V2}/pods/{pod_id}", json=body)
            if field is None:
                assert r.status_code == 200, r.text  # the current values: no change
                continue
            problem_body = v2_problem(r, 400, "VALIDATION_ERROR", path, "PATCH")
            assert problem_body["errors"][0].startswith(field), problem_body
        assert get(c, pod_id)["status"] == "RUNNING"
        # A stopped pod is started with its new image.
        acted(c, pod_id, "stop")
        settle(srv)
        r = c.patch(f"{V2}/pods/{pod_id}", json={"image": "img2"})
        assert r.status_code == 200, r.text
        settle(srv)
        pod = get(c, pod_id)
        assert pod["image"] == "img2" and pod["status"] == "RUNNING"


@pytest.fixture
def big_srv(tmp_path: Path) -> Iterator[LiveServer]:
    settings = make_settings(
        tmp_path / "home",
        local_vcpus=1024,
        local_memory_gb=8192,
        rate_limit_per_key=0,
        rate_limit_per_source=0,
    )
    with live_server(settings, FakeRuntime()) as server:
        yield server


def test_cursor_pages_show_each_of_120_pods_once(big_srv: LiveServer) -> None:
    srv = big_srv
    with srv.client() as c:
        made = {created(srv, c, {**CPU_BODY, "name": f"p{i}"})["id"] for i in range(120)}
        seen: list[str] = []
        cursor: str | None = None
        pages = 0
        while True:
            params: dict[str, Any] = {"limit": 50}
            if cursor is not None:
                params["cursor"] = cursor
            r = c.get(f"{V2}/pods", params=params)
            assert r.status_code == 200, r.text
            body = r.json()
            check_answer("GET", "/v2/pods", 200, body)
            seen += [p["id"] for p in body["pods"]]
            pages += 1
            cursor = body["nextCursor"]
            if cursor is None:
                break
            # A pod made between pages sorts before the cursor: no page shows it twice.
            if pages == 1:
                created(srv, c, {**CPU_BODY, "name": "late"})
        assert pages == 3
        assert len(seen) == len(set(seen)) == 120
        assert set(seen) == made
        everything = c.get(f"{V2}/pods").json()["pods"]
        assert len(everything) == 121
        named = c.get(f"{V2}/pods", params={"name": "p7"}).json()["pods"]
        assert [p["name"] for p in named] == ["p7"]
        # A cursor is bound to its filters.
        r = c.get(f"{V2}/pods", params={"limit": 50, "cursor": cursor or _first_cursor(c)})
        assert r.status_code == 200
        r = c.get(f"{V2}/pods", params={"limit": 5, "name": "p7", "cursor": _first_cursor(c)})
        v2_problem(r, 400, "VALIDATION_ERROR", "/v2/pods", "GET")
        settle(srv)


def _first_cursor(c: httpx.Client) -> str:
    cursor: str = c.get(f"{V2}/pods", params={"limit": 5}).json()["nextCursor"]
    return cursor


def test_filters_narrow_the_list(srv: LiveServer) -> None:
    with srv.client() as c:
        gpu = created(srv, c)["id"]
        cpu = created(srv, c, {**CPU_BODY, "image": "other"})["id"]
        settle(srv)

        def ids(**params: Any) -> list[str]:
            r = c.get(f"{V2}/pods", params=params)
            assert r.status_code == 200, r.text
            check_answer("GET", "/v2/pods", 200, r.json())
            return [p["id"] for p in r.json()["pods"]]

        assert ids(gpuTypeId=GPU) == [gpu]
        assert ids(imageName="other") == [cpu]
        assert sorted(ids(status="RUNNING")) == sorted([gpu, cpu])
        assert ids(status="EXITED") == []
        location = get(c, gpu)["dataCenterId"]
        assert sorted(ids(dataCenterId=location)) == sorted([gpu, cpu])
        assert ids(dataCenterId="nowhere") == []
        assert ids(templateId="none") == []
        assert ids(networkVolumeId="none") == []
        assert sorted(ids(includeClusterPods="true")) == sorted([gpu, cpu])
        acted(c, cpu, "stop")
        settle(srv)
        assert ids(status="EXITED") == [cpu]


def test_bad_input_is_an_rfc_9457_problem(srv: LiveServer) -> None:
    with srv.client() as c:
        pod_id = created(srv, c)["id"]
        no_name = {k: v for k, v in BODY.items() if k != "name"}
        body = v2_problem(
            c.post(f"{V2}/pods", json=no_name), 422, "VALIDATION_ERROR", "/v2/pods", "POST"
        )
        assert any(e.startswith("name") for e in body["errors"]), body
        body = v2_problem(
            c.post(f"{V2}/pods", json={**BODY, "gpu": {"id": "NVIDIA H9000"}}),
            400, "VALIDATION_ERROR", "/v2/pods", "POST",
        )  # fmt: skip
        assert body["errors"][0].startswith("gpu.id"), body
        both = {**BODY, "cpu": {"id": "cpu3c", "vcpuCount": 2}}
        body = v2_problem(
            c.post(f"{V2}/pods", json=both), 400, "VALIDATION_ERROR", "/v2/pods", "POST"
        )
        assert body["errors"] == ["gpu"]
        for bad, field in (
            ({**BODY, "ports": ["70000/tcp"]}, "ports[0]"),
            ({**BODY, "dataCenterIds": ["nowhere"]}, "dataCenterIds"),
            ({**BODY, "registry": "abc"}, "registry"),
            ({**BODY, "env": {"1BAD": "x"}}, "env"),
            ({**BODY, "args": "a", "cmd": "b"}, "cmd"),
        ):
            body = v2_problem(
                c.post(f"{V2}/pods", json=bad), 400, "VALIDATION_ERROR", "/v2/pods", "POST"
            )
            assert body["errors"][0].startswith(field), body
        r = c.post(f"{V2}/pods", content=b"{not json", headers={"content-type": "application/json"})
        v2_problem(r, 400, "VALIDATION_ERROR", "/v2/pods", "POST")
        r = act(c, pod_id, "explode")
        body = v2_problem(r, 422, "VALIDATION_ERROR", "/v2/pods/{id}/action", "POST")
        assert body["errors"][0].startswith("action"), body
        for method, path in ROUTES:
            r = _call(c, method, path, "nosuchpod0000")
            v2_problem(
                r,
                404,
                "CLUSTER_NOT_FOUND",
                path.replace(V2, "/v2").replace("{pod_id}", "{id}"),
                method,
            )
        r = c.get(f"{V2}/pods", params={"limit": 5, "cursor": "garbage"})
        body = v2_problem(r, 400, "VALIDATION_ERROR", "/v2/pods", "GET")
        assert body["errors"][0].startswith("cursor")
        v2_problem(
            c.get(f"{V2}/pods", params={"status": "SLEEPING"}),
            400,
            "VALIDATION_ERROR",
            "/v2/pods",
            "GET",
        )
        v2_problem(
            c.get(f"{V2}/pods", params={"limit": 0}), 422, "VALIDATION_ERROR", "/v2/pods", "GET"
        )
        settle(srv)


ROUTES = (
    ("GET", f"{V2}/pods/{{pod_id}}"),
    ("PATCH", f"{V2}/pods/{{pod_id}}"),
    ("DELETE", f"{V2}/pods/{{pod_id}}"),
    ("POST", f"{V2}/pods/{{pod_id}}/action"),
    ("GET", f"{V2}/pods/{{pod_id}}/logs"),
)
BODIES = {"PATCH": {"name": "mine now"}, "POST": {"action": "stop"}}


def _call(c: httpx.Client, method: str, path: str, pod_id: str) -> httpx.Response:
    url = path.replace("{pod_id}", pod_id)
    params = {"follow": "false"} if url.endswith("/logs") else None
    return c.request(method, url, json=BODIES.get(method), params=params)


def test_another_accounts_key_hears_404_for_this_accounts_pod(srv: LiveServer) -> None:
    _, _, keys = account_with_members(srv, "other@b.test", ())
    with srv.client() as mine, srv.client(keys["owner"]) as theirs:
        pod_id = created(srv, mine)["id"]
        settle(srv)
        for method, path in ROUTES:
            r = _call(theirs, method, path, pod_id)
            template = path.replace(V2, "/v2").replace("{pod_id}", "{id}")
            v2_problem(r, 404, "CLUSTER_NOT_FOUND", template, method)
        assert theirs.get(f"{V2}/pods").json() == {"pods": []}
        # Nothing changed: still running, still its name.
        pod = get(mine, pod_id)
        assert pod["status"] == "RUNNING" and pod["name"] == "trainer"


def test_a_missing_bearer_is_401(srv: LiveServer) -> None:
    with httpx.Client(base_url=srv.url, verify=trusted_tls()) as anonymous:
        for method, path in (*ROUTES, ("GET", f"{V2}/pods"), ("POST", f"{V2}/pods")):
            r = _call(anonymous, method, path, "nosuchpod0000")
            body = problem(r, 401, "UNAUTHORIZED")
            assert r.headers["www-authenticate"] == "Bearer"
            assert body["title"] == "Unauthorized"


def test_logs_stream_as_server_sent_events(srv: LiveServer, fake_runtime: FakeRuntime) -> None:
    with srv.client() as c:
        pod_id = created(srv, c)["id"]
        settle(srv)
        fake_runtime.containers[pod_id].log_lines.extend(["model loaded", "serving"])
        url = f"{V2}/pods/{pod_id}/logs"
        r = c.get(url, params={"follow": "false"})
        assert r.status_code == 200, r.text
        assert r.headers["content-type"].startswith("text/event-stream")
        check_answer("GET", "/v2/pods/{id}/logs", 200, r.text)
        sent = [json.loads(line[5:]) for line in r.text.splitlines() if line.startswith("data:")]
        assert {"model loaded", "serving"} <= {
            e["line"] for e in sent if e["source"] == "container"
        }
        assert any(e["source"] == "system" for e in sent)
        only = c.get(url, params={"follow": "false", "source": "container"}).text
        lines = [json.loads(x[5:]) for x in only.splitlines() if x.startswith("data:")]
        assert [e["line"] for e in lines][-2:] == ["model loaded", "serving"]
        assert {e["source"] for e in lines} == {"container"}
        # Followed: a line printed later arrives; Last-Event-ID resumes after it.
        with c.stream("GET", url, params={"tail": 1, "source": "container"}) as live:
            got = events(live)
            first = next(got)
            assert first.json["line"] == "serving"
            fake_runtime.containers[pod_id].log_lines.append("step 1")
            nxt = next(got)
            assert nxt.json["line"] == "step 1" and nxt.id
        resumed = c.get(url, params={"follow": "false"}, headers={"Last-Event-ID": first.id or ""})
        assert "step 1" in resumed.text and "serving" not in resumed.text
        r = c.get(url, params={"source": "stdout"})
        body = problem(r, 400, "VALIDATION_ERROR")
        assert body["errors"] == ["source"]
        problem(c.get(url, headers={"Last-Event-ID": "yesterday-ish"}), 400, "VALIDATION_ERROR")


def test_the_routes_are_in_openapi_with_problem_errors(srv: LiveServer) -> None:
    doc = httpx.get(f"{srv.url}/openapi.json", timeout=60, verify=trusted_tls()).json()
    for method, path in (*ROUTES, ("GET", f"{V2}/pods"), ("POST", f"{V2}/pods")):
        op = doc["paths"][path][method.lower()]
        assert op["tags"] == ["runpod-v2"]
        for status in ("400", "401", "404"):
            assert PROBLEM_MEDIA_TYPE in op["responses"][status]["content"], (method, path)


def test_a_template_fills_what_the_create_leaves_out(srv: LiveServer) -> None:
    with srv.client() as c:
        body = {"name": "t", "docker_image": "tpl-img", "env": {"FROM": "template"}}
        r = c.post("/v1/templates", json=body)
        assert r.status_code == 201, r.text
        tid = r.json()["data"]["id"]
        pod = created(srv, c, {"name": "from-t", "templateId": tid, "gpu": {"id": GPU}})
        assert pod["image"] == "tpl-img" and pod["template"] == tid
        assert pod["env"] == {"FROM": "template"}
        settle(srv)
        listed = c.get(f"{V2}/pods", params={"templateId": tid}).json()["pods"]
        assert [p["id"] for p in listed] == [pod["id"]]
        r = c.post(f"{V2}/pods", json={"name": "x", "templateId": "nosuchtpl", "gpu": {"id": GPU}})
        # gpuyard's answer for an unknown template is a 400 naming the field.
        body = v2_problem(r, 400, "VALIDATION_ERROR", "/v2/pods", "POST")
        assert body["errors"] == ["templateId"]


def test_a_starting_pods_container_settings_wait(
    srv: LiveServer, fake_runtime: FakeRuntime
) -> None:
    gate = threading.Event()
    fake_runtime.pull_gate = gate  # the image's pull waits: the pod stays starting
    with srv.client() as c:
        pod_id = created(srv, c, {**BODY, "image": "slow-img"})["id"]
        assert get(c, pod_id)["status"] in ("PROVISIONING", "STARTING")
        r = c.patch(f"{V2}/pods/{pod_id}", json={"name": "n2", "image": "img2"})
        body = v2_problem(r, 409, "INVALID_STATE", "/v2/pods/{id}", "PATCH")
        assert "starting" in body["detail"]
        # Refused whole: not even the name changed. A name alone changes at once.
        assert get(c, pod_id)["name"] == "trainer"
        r = c.patch(f"{V2}/pods/{pod_id}", json={"name": "n2"})
        assert r.status_code == 200 and r.json()["name"] == "n2", r.text
        gate.set()
        settle(srv)
        assert get(c, pod_id)["status"] == "RUNNING"
        r = c.patch(f"{V2}/pods/{pod_id}", json={"image": "img2"})
        assert r.status_code == 200, r.text
        settle(srv)
        assert get(c, pod_id)["image"] == "img2"


def test_entrypoint_cmd_and_cuda_versions_reach_the_cluster(srv: LiveServer) -> None:
    """What REST-v2 clients send beyond the document is honoured, not dropped: the
    entrypoint and command run as given, and CUDA versions constrain placement."""
    with srv.client() as c:
        body = {**BODY, "entrypoint": ["/bin/sh", "-c"], "cmd": ["echo hi; sleep 600"]}
        pod = created(srv, c, body)
        cluster = c.get(f"/v1/clusters/{pod['id']}").json()["data"]
        assert cluster["docker_entrypoint"] == ["/bin/sh", "-c"]
        assert cluster["docker_args"] == "'echo hi; sleep 600'"
        # This server's host declares no CUDA version: a minimum cannot be met, and the
        # refusal says which field asked for it.
        too_new = {**BODY, "name": "cuda", "gpu": {"id": GPU, "minCudaVersion": "13.0"}}
        r = c.post(f"{V2}/pods", json=too_new)
        body_ = v2_problem(r, 400, "INSUFFICIENT_CAPACITY", "/v2/pods", "POST")
        assert "min_cuda_version" in body_["detail"] or "minCudaVersion" in body_["detail"]
