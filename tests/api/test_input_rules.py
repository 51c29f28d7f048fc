"""Hostile input is refused with a 400 in the surface's own envelope (REST v1, v2,
GraphQL, training), never stored and never a 500: too many or too large environment
variables, names with control or bidirectional-text characters, strings and booleans
where numbers belong, volumes mounted over system directories, JSON nested 10,000 deep
and ids beyond the store's 32-bit range. And a 500 does not cost the client its
keep-alive connection."""

from __future__ import annotations

import base64
import os
import socket
import struct
import time
from typing import Any

import httpx
import pytest

from gpuyard.core.tls_trust import trusted_tls
from gpuyard.testing.fake_runtime import FakeRuntime
from tests.helpers import LiveServer

A6000 = "NVIDIA RTX A6000"
CREATE = {"gpu_type": A6000, "docker_image": "img"}
TRAINING = "/distributed_jobs_v2/cluster/"
DEEP = 10_000
POD_DEPLOY = (
    "mutation($input: PodFindAndDeployOnDemandInput!) "
    "{ podFindAndDeployOnDemand(input: $input) { id } }"
)


def v1_error(r: httpx.Response, field: str, status: int = 400) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body: dict[str, Any] = r.json()
    assert body["success"] is False and body["error"]["code"] == "VALIDATION_ERROR", body
    assert body["error"]["details"]["field"] == field, body
    return body


def gql(srv: LiveServer, query: str, variables: dict[str, Any] | None = None) -> httpx.Response:
    return httpx.post(
        f"{srv.url}/graphql",
        json={"query": query, "variables": variables},
        headers={"Authorization": f"Bearer {srv.key}"},
        timeout=60,
        verify=trusted_tls(),
    )


def gql_error(r: httpx.Response, status: int = 200) -> dict[str, Any]:
    """The GraphQL envelope (not REST's) with one VALIDATION_ERROR."""
    assert r.status_code == status, r.text
    body: dict[str, Any] = r.json()
    assert "success" not in body and "error" not in body, body
    error: dict[str, Any] = body["errors"][0]
    assert error["extensions"]["code"] == "VALIDATION_ERROR", body
    return error


def deploy(srv: LiveServer, **fields: Any) -> httpx.Response:
    return gql(srv, POD_DEPLOY, {"input": {"gpuTypeId": A6000, "imageName": "img", **fields}})


def assert_nothing_created(srv: LiveServer) -> None:
    with srv.client() as c:
        assert c.get("/v1/clusters").json()["data"]["clusters"] == []


def ed25519_line() -> str:
    blob = b"".join(struct.pack(">I", len(f)) + f for f in (b"ssh-ed25519", os.urandom(32)))
    return f"ssh-ed25519 {base64.b64encode(blob).decode()}"


# -- environment --------------------------------------------------------------------


def test_environment_limits_rest(srv: LiveServer) -> None:
    with srv.client() as c:
        too_many = {f"K{i}": "v" for i in range(257)}
        body = v1_error(c.post("/v1/clusters", json={**CREATE, "env": too_many}), "env")
        assert "at most 256" in body["error"]["message"]
        big = "x" * (32 * 1024 + 1)
        v1_error(c.post("/v1/clusters", json={**CREATE, "env": {"BIG": big}}), "env")
        # Bytes, not characters: 10,000 three-byte characters are 30,000 bytes...
        ok = c.post("/v1/clusters", json={**CREATE, "env": {"WIDE": "€" * 10_000}})
        assert ok.status_code == 201, ok.text
        c.delete(f"/v1/clusters/{ok.json()['data']['id']}")
        # ...and 11,000 of them are over 32 KiB.
        v1_error(c.post("/v1/clusters", json={**CREATE, "env": {"WIDE": "€" * 11_000}}), "env")
        v1_error(c.post("/v1/clusters", json={**CREATE, "env": {"N" * 257: "v"}}), "env")
        # Start's updates, v1 and v2 (the body is judged before the cluster is looked up).
        for path in ("/v1/clusters/nope/start", "/v2/clusters/nope/start"):
            r = c.post(path, json={"environment_updates": too_many})
            v1_error(r, "environment_updates")
        # 256 is allowed.
        made = c.post("/v1/clusters", json={**CREATE, "env": {f"K{i}": "v" for i in range(256)}})
        assert made.status_code == 201, made.text


def test_environment_limits_graphql(srv: LiveServer) -> None:
    too_many = [{"key": f"K{i}", "value": "v"} for i in range(257)]
    assert "input.env" in gql_error(deploy(srv, env=too_many))["message"]
    # The same name 257 times is still 257 entries.
    same = [{"key": "K", "value": "v"}] * 257
    assert "input.env" in gql_error(deploy(srv, env=same))["message"]
    big = [{"key": "BIG", "value": "x" * (32 * 1024 + 1)}]
    assert "input.env" in gql_error(deploy(srv, env=big))["message"]
    # (The 256 KiB total is tests/unit/test_input_rules.py's: the default body limit
    # refuses such a request before it is read.)
    assert_nothing_created(srv)


def test_environment_updates_cannot_add_up_past_the_limit(srv: LiveServer) -> None:
    with srv.client() as c:
        env = {f"A{i}": "v" for i in range(200)}
        cid = c.post("/v1/clusters", json={**CREATE, "env": env}).json()["data"]["id"]
        assert srv.server.reconciler.wait_idle(10)
        assert c.post(f"/v1/clusters/{cid}/stop").status_code == 200
        assert srv.server.reconciler.wait_idle(10)
        more = {f"B{i}": "v" for i in range(100)}
        r = c.post(f"/v1/clusters/{cid}/start", json={"environment_updates": more})
        body = v1_error(r, "environment_updates")
        assert "300" in body["error"]["message"]
        # Replacing and removing within the limit is fine.
        fewer: dict[str, str | None] = {f"A{i}": None for i in range(100)} | more
        r = c.post(f"/v1/clusters/{cid}/start", json={"environment_updates": fewer})
        assert r.status_code == 200, r.text
        assert len(r.json()["data"]["env"]) == 200


# -- names --------------------------------------------------------------------------

HOSTILE_NAMES = [
    "evil\u202etxt.exe",
    "bell\x07",
    "esc\x1b[31m",
    "c1\x85",
    "iso\u2066x",
    "rlm\u200f",
]


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_hostile_names_are_refused_everywhere(srv: LiveServer, name: str) -> None:
    with srv.client() as c:
        v1_error(c.post("/v1/clusters", json={**CREATE, "name": name}), "name")
        v1_error(c.post("/v1/projects", json={"name": name}), "name")
        v1_error(c.post("/v1/ssh-keys", json={"name": name, "public_key": ed25519_line()}), "name")
        v1_error(c.post("/v1/security-groups", json={"name": name, "rules": []}), "name")
        image = {"name": "img", "version": name, "image": "docker.io/library/ubuntu:22.04"}
        v1_error(c.post("/v1/images", json=image), "version")
        port = {"internal_port": 8888, "description": name}
        v1_error(c.post("/v1/clusters", json={**CREATE, "ports": [port]}), "ports")
        r = c.post(TRAINING, params={"project_id": 1, "location": "local"}, json={"name": name})
        assert r.status_code == 400 == r.json()["code"], r.text
        assert r.json()["errors"]["field"] == "name", r.text
    assert "input.name" in gql_error(deploy(srv, name=name))["message"]
    assert_nothing_created(srv)


def test_ordinary_names_and_multiline_descriptions_still_pass(srv: LiveServer) -> None:
    with srv.client() as c:
        name = "Café \u2013 日本語 (ünïcode) 🚀"
        made = c.post("/v1/clusters", json={**CREATE, "name": name})
        assert made.status_code == 201 and made.json()["data"]["name"] == name, made.text
        group = {"name": name, "description": "line one\n\tline two", "rules": []}
        assert c.post("/v1/security-groups", json=group).status_code == 201
        bidi = {"name": "g2", "description": "a\u202eb", "rules": []}
        v1_error(c.post("/v1/security-groups", json=bidi), "description")


# -- numbers ------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["2", True, 2.5, "two"])
def test_numbers_are_not_coerced_rest(srv: LiveServer, value: Any) -> None:
    with srv.client() as c:
        v1_error(c.post("/v1/clusters", json={**CREATE, "gpu_count": value}), "gpu_count")
        v1_error(c.post("/v1/clusters", json={**CREATE, "volume_gb": value}), "volume_gb")
        for path in ("/v1/clusters/nope/start", "/v2/clusters/nope/start"):
            r = c.post(path, json={"timeout_minutes": value})
            v1_error(r, "timeout_minutes")
            r = c.post(path, json={"update_configuration": {"cpu_cores": value}})
            v1_error(r, "update_configuration.cpu_cores")
        r = c.post("/v1/clusters/nope/bid-resume", json={"bid_per_gpu": 0.5, "gpu_count": value})
        v1_error(r, "gpu_count")
    assert_nothing_created(srv)


def test_each_refused_field_says_why_for_clients_to_word(srv: LiveServer) -> None:
    # Beside the message: pydantic's reason and its plain limits (the console words them
    # "Image: required", "vCPU: at least 1").
    with srv.client() as c:
        body = v1_error(
            c.post("/v1/clusters", json={**CREATE, "docker_image": "", "cpu_cores": 0}),
            "cpu_cores",
        )
    errors = {e["field"]: e for e in body["error"]["details"]["errors"]}
    assert errors["docker_image"]["reason"] == "string_too_short"
    assert errors["docker_image"]["limits"] == {"min_length": 1}
    assert errors["cpu_cores"]["reason"] == "greater_than_equal"
    assert errors["cpu_cores"]["limits"] == {"ge": 1}
    assert_nothing_created(srv)


def test_a_whole_float_is_an_integer_rest(srv: LiveServer) -> None:
    # JSON Schema counts 2.0 as an integer; so does the server (not "2" or true).
    with srv.client() as c:
        r = c.post("/v1/clusters", json={**CREATE, "gpu_count": 0.0, "volume_gb": 1.0})
        assert r.status_code == 201, r.text
        assert r.json()["data"]["volume_gb"] == 1


def test_booleans_are_not_coerced_rest(srv: LiveServer) -> None:
    with srv.client() as c:
        for value in ("true", 1, "yes"):
            r = c.post("/v1/clusters", json={**CREATE, "interruptible": value})
            v1_error(r, "interruptible")
            v1_error(
                c.post("/v1/clusters/x/start", json={"wait_for_ready": value}), "wait_for_ready"
            )
        # Floats still take integers: a bid of 1 is 1.0.
        r = c.post("/v1/clusters/nope/bid-resume", json={"bid_per_gpu": 1})
        assert r.status_code == 404, r.text


@pytest.mark.parametrize("value", ["2", True, 2.5])
def test_numbers_are_not_coerced_graphql(srv: LiveServer, value: Any) -> None:
    # GraphQL's own type system refuses these (variables and literals alike).
    error = gql_error(deploy(srv, gpuCount=value))
    assert "gpuCount" in error["message"], error
    literal = 'mutation { podFindAndDeployOnDemand(input: {gpuCount: "2", imageName: "i"}) { id } }'
    gql_error(gql(srv, literal))
    assert_nothing_created(srv)


# -- volume mount path --------------------------------------------------------------

FORBIDDEN_MOUNTS = [
    "/",
    "/sys",
    "/proc",
    "/proc/self",
    "/dev",
    "/dev/shm",
    "/etc",
    "/etc/cron.d",
    "/usr",
    "/usr/local/bin",
    "/bin",
    "/sbin",
    "/lib",
    "/lib64",
    "/lib/x86_64-linux-gnu",
    "/boot",
    "/run",
    "/run/secrets",
    "/var/run",
    "/workspace/../etc",
    "/workspace/./x",
    "//etc",
    "/workspace/",
    "workspace",
    "/data:ro",
    "/a,b",
    "/with space",
]


def test_forbidden_mount_paths(srv: LiveServer) -> None:
    with srv.client() as c:
        for path in FORBIDDEN_MOUNTS:
            r = c.post("/v1/clusters", json={**CREATE, "volume_mount_path": path})
            v1_error(r, "volume_mount_path")
            error = gql_error(deploy(srv, volumeMountPath=path))
            assert "input.volumeMountPath" in error["message"], (path, error)
        for path in ("/workspace", "/data/models", "/root/cache", "/opt/app-1.2", "/var/lib/x"):
            r = c.post("/v1/clusters", json={**CREATE, "volume_mount_path": path, "gpu_count": 0})
            assert r.status_code == 201, (path, r.text)
            assert r.json()["data"]["volume_mount_path"] == path


# -- deep JSON ----------------------------------------------------------------------


def test_deep_json_to_graphql_is_a_graphql_400(srv: LiveServer) -> None:
    headers = {"Authorization": f"Bearer {srv.key}", "content-type": "application/json"}
    with httpx.Client(base_url=srv.url, headers=headers, timeout=60, verify=trusted_tls()) as c:
        bodies = [
            b"[" * DEEP + b"]" * DEEP,
            b"[" * DEEP,
            b'{"query": "{ myself { id } }", "variables": {"a": '
            + b"[" * DEEP
            + b"]" * DEEP
            + b"}}",
            b'{"query": "{ myself { id } }", "variables": ' + b'{"a":' * DEEP + b"1" + b"}" * DEEP,
        ]
        for body in bodies:
            error = gql_error(c.post("/graphql", content=body), 400)
            assert "deeper than 64" in error["message"], error
        deep_vars = "[" * DEEP + "]" * DEEP
        r = c.get("/graphql", params={"query": "{ myself { id } }", "variables": deep_vars})
        gql_error(r, 400)
        # 64 levels in all are fine (the variable is unused, so no error at all).
        fine = b'{"query": "{ myself { id } }", "variables": {"a": ' + b"[" * 62 + b"]" * 62 + b"}}"
        r = c.post("/graphql", content=fine)
        assert r.status_code == 200 and "errors" not in r.json(), r.text
        # Brackets inside strings nest nothing.
        text = "[" * DEEP
        r = c.post("/graphql", json={"query": "{ myself { id } }", "variables": {"a": text}})
        assert r.status_code == 200 and "errors" not in r.json(), r.text


def test_deep_json_to_rest_and_training_is_a_400_in_their_envelopes(srv: LiveServer) -> None:
    deep = b"[" * DEEP + b"]" * DEEP
    headers = {"content-type": "application/json"}
    with srv.client() as c:
        for path in ("/v1/clusters", "/v1/projects", "/v2/clusters/x/start"):
            r = c.post(path, content=deep, headers=headers)
            assert r.status_code == 400, (path, r.text)
            assert r.json()["success"] is False, r.text
        r = c.post(
            TRAINING, params={"project_id": 1, "location": "local"}, content=deep, headers=headers
        )
        assert r.status_code == 400 == r.json()["code"], r.text


# -- ids out of range ---------------------------------------------------------------

HUGE = "99999999999999999999"


def test_ids_out_of_range_are_400(srv: LiveServer) -> None:
    with srv.client() as c:
        for value in (HUGE, str(2**31), "0", "-1", "1e3"):
            v1_error(c.get("/v1/billing", params={"project_id": value}), "project_id")
            v1_error(c.get("/v1/security-groups", params={"project_id": value}), "project_id")
            v1_error(c.get("/v1/ssh-keys", params={"active_iam": value}), "active_iam")
        assert c.get("/v1/billing", params={"project_id": str(2**31 - 1)}).status_code == 404
        for path in (f"/v1/ssh-keys/{HUGE}", f"/v1/security-groups/{2**31}"):
            assert c.get(path).status_code == 400, path
        r = c.get(f"{TRAINING}{HUGE}/", params={"project_id": 1, "location": "local"})
        assert r.status_code == 400 == r.json()["code"], r.text
        r = c.get(TRAINING, params={"project_id": HUGE, "location": "local"})
        assert r.status_code == 400 == r.json()["code"], r.text
    # GraphQL's Int is 32-bit: a larger literal or variable is a validation error.
    error = gql_error(deploy(srv, gpuCount=int(HUGE)))
    assert "gpuCount" in error["message"], error
    big = f'mutation {{ podResume(input: {{podId: "x", gpuCount: {HUGE}}}) {{ id }} }}'
    gql_error(gql(srv, big))


# -- keep-alive after a 500 ---------------------------------------------------------


class FailingHealth(FakeRuntime):
    """A runtime whose availability check raises once ``broken`` is set: an
    unexpected exception in a handler (``/healthz``), as a bug would raise."""

    broken = False

    def available(self) -> str | None:
        if self.broken:
            raise RuntimeError("engine probe exploded")
        return super().available()


@pytest.fixture
def fake_runtime() -> FakeRuntime:
    return FailingHealth()


def _exchange(sock: socket.socket, path: str) -> tuple[int, bytes]:
    """One HTTP/1.1 request on ``sock`` and its whole response (Content-Length)."""
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: test\r\n\r\n".encode())
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed before the answer to {path}")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    length = next(int(h.split(":")[1]) for h in lines if h.lower().startswith("content-length"))
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed in the middle of the answer to {path}")
        body += chunk
    return int(lines[0].split()[1]), body


def test_a_500_keeps_the_connection_alive(srv: LiveServer, fake_runtime: FakeRuntime) -> None:
    assert isinstance(fake_runtime, FailingHealth)
    host, port = srv.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        assert _exchange(sock, "/healthz")[0] == 200
        fake_runtime.broken = True
        status, body = _exchange(sock, "/healthz")
        assert status == 500 and b"INTERNAL_ERROR" in body and b"exploded" not in body, body
        fake_runtime.broken = False
        # The same connection serves the next request.
        assert _exchange(sock, "/healthz")[0] == 200
    # The forced 500 was the point of this test; the fixture refuses any other.
    assert srv.recorder.statuses.count(500) == 1
    srv.recorder.statuses.remove(500)


def test_repeated_environment_updates_cannot_grow_past_the_limits(srv: LiveServer) -> None:
    kib32 = "x" * (32 * 1024 - 16)
    with srv.client() as c:
        env = {f"BIG{i}": kib32 for i in range(7)}
        made = c.post("/v1/clusters", json={**CREATE, "env": env})
        assert made.status_code == 201, made.text
        cid = made.json()["data"]["id"]
        assert c.post(f"/v1/clusters/{cid}/stop").status_code == 200
        deadline = time.monotonic() + 30
        while c.get(f"/v1/clusters/{cid}").json()["data"]["status"] != "stopped":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        # Each body is within its own limits; together they would pass 256 KiB.
        more = {"environment_updates": {"MORE0": kib32, "MORE1": kib32}}
        body = v1_error(c.post(f"/v1/clusters/{cid}/start", json=more), "environment_updates")
        assert "bytes" in body["error"]["message"], body
        shown = c.get(f"/v1/clusters/{cid}").json()["data"]
        assert shown["status"] == "stopped" and "MORE0" not in str(shown.get("env"))
        # Replacing values keeps the size: allowed.
        same = {"environment_updates": {"BIG0": "small"}}
        assert c.post(f"/v1/clusters/{cid}/start", json=same).status_code == 200
