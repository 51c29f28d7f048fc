"""A cluster's ``docker_entrypoint`` over real HTTP on SQLite: stored with the cluster,
handed to the engine at every start (with docker_args as its command), answered by
REST /v1 and GraphQL (``dockerEntrypoint``), bounded and NUL-free, and another
account's key cannot read it."""

from __future__ import annotations

from typing import Any

import httpx

from gpuyard.core.tls_trust import trusted_tls
from gpuyard.reconciler.clusters.container_spec import container_command
from gpuyard.services.clusters.requests import CreateCluster
from gpuyard.testing.fake_runtime import FakeRuntime
from tests.api.test_graphql import gql
from tests.helpers import LiveServer, account_with_members, created, v1_error

SHELL = ["/bin/sh", "-c"]
SCRIPT = "echo hello-entrypoint; sleep 600"


def body(**extra: Any) -> dict[str, Any]:
    return {"docker_image": "x", "cpu_cores": 1, "memory_gb": 1, **extra}


def test_the_entrypoint_is_kept_shown_and_given_at_every_start(
    srv: LiveServer, fake_runtime: FakeRuntime
) -> None:
    with srv.client() as c:
        cid = created(srv, c, body(docker_entrypoint=SHELL, docker_args=SCRIPT))
        data = c.get(f"/v1/clusters/{cid}").json()["data"]
        assert data["docker_entrypoint"] == SHELL
        assert data["docker_args"] == SCRIPT
        spec = fake_runtime.containers[cid].spec
        # After a shell's -c the whole text is the script: one argument.
        assert spec.entrypoint == tuple(SHELL)
        assert spec.command == (SCRIPT,)
        listed = c.get("/v1/clusters").json()["data"]["clusters"]
        assert [x["docker_entrypoint"] for x in listed if x["id"] == cid] == [SHELL]
        assert c.post(f"/v1/clusters/{cid}/stop").status_code == 200
        assert srv.server.reconciler.wait_idle(10)
        assert c.post(f"/v1/clusters/{cid}/start", json={}).status_code == 200
        assert srv.server.reconciler.wait_idle(10)
        assert c.get(f"/v1/clusters/{cid}").json()["data"]["status"] == "running"
        assert fake_runtime.containers[cid].spec.entrypoint == tuple(SHELL)
        # Left out: the image's own (null); [] clears it.
        plain = created(srv, c, body(docker_args="sleep 600"))
        assert c.get(f"/v1/clusters/{plain}").json()["data"]["docker_entrypoint"] is None
        assert fake_runtime.containers[plain].spec.entrypoint is None
        assert fake_runtime.containers[plain].spec.command == ("sleep", "600")
        cleared = created(srv, c, body(docker_entrypoint=[], docker_args="/bin/sleep 600"))
        assert c.get(f"/v1/clusters/{cleared}").json()["data"]["docker_entrypoint"] == []
        assert fake_runtime.containers[cleared].spec.entrypoint == ()
    pod = gql(srv, f'{{ pod(input: {{podId: "{cid}"}}) {{ dockerEntrypoint dockerArgs }} }}')
    assert pod["data"]["pod"] == {"dockerEntrypoint": SHELL, "dockerArgs": SCRIPT}


def test_bad_entrypoints_are_refused_in_the_envelope(srv: LiveServer) -> None:
    with srv.client() as c:
        for bad in (
            ["/bin/sh", "-c\u0000"],
            "/bin/sh -c",  # a list, not a string
            ["a"] * 65,
            ["x" * 4097],
            ["x" * 4000, "y" * 4000, "z" * 400],
            [1, 2],
        ):
            r = c.post("/v1/clusters", json=body(docker_entrypoint=bad))
            error = v1_error(r, 400, "VALIDATION_ERROR")
            assert "docker_entrypoint" in error["message"], error
        assert c.get("/v1/clusters").json()["data"]["clusters"] == []


def test_another_account_cannot_see_it(srv: LiveServer) -> None:
    with srv.client() as c:
        cid = created(srv, c, body(docker_entrypoint=SHELL, docker_args=SCRIPT))
    _, _, keys = account_with_members(srv, "other@c.test", ())
    with httpx.Client(
        base_url=srv.url,
        headers={"Authorization": f"Bearer {keys['owner']}"},
        timeout=30,
        verify=trusted_tls(),
    ) as other:
        v1_error(other.get(f"/v1/clusters/{cid}"), 404)
        assert other.get("/v1/clusters").json()["data"]["clusters"] == []
    pod = gql(srv, f'{{ pod(input: {{podId: "{cid}"}}) {{ dockerEntrypoint }} }}', keys["owner"])
    assert pod.get("data", {}).get("pod") is None


def test_the_command_after_a_shell_is_one_argument() -> None:
    assert container_command(None, "") is None
    assert container_command(("/bin/sh", "-c"), "  ") is None
    assert container_command(None, "echo 'a b' c") == ("echo", "a b", "c")
    assert container_command(("/bin/bash", "-c"), "echo a; echo b") == ("echo a; echo b",)
    assert container_command((), "sleep 1") == ("sleep", "1")
    assert CreateCluster(docker_image="x", docker_entrypoint=[]).docker_entrypoint == []
    assert CreateCluster(docker_image="x").docker_entrypoint is None


def test_a_template_carries_an_entrypoint(srv: LiveServer, fake_runtime: FakeRuntime) -> None:
    with srv.client() as c:
        r = c.post(
            "/v1/templates",
            json={"name": "shell", "docker_image": "x", "docker_entrypoint": SHELL,
                  "docker_args": SCRIPT},
        )  # fmt: skip
        assert r.status_code == 201, r.text
        template = r.json()["data"]
        assert template["docker_entrypoint"] == SHELL
        made = created(srv, c, {"template_id": template["id"], "cpu_cores": 1, "memory_gb": 1})
        assert c.get(f"/v1/clusters/{made}").json()["data"]["docker_entrypoint"] == SHELL
        assert fake_runtime.containers[made].spec.command == (SCRIPT,)
        # What the create sends wins; [] is sent, not left out.
        own = created(srv, c, body(template_id=template["id"], docker_entrypoint=[]))
        assert c.get(f"/v1/clusters/{own}").json()["data"]["docker_entrypoint"] == []
        r = c.patch(f"/v1/templates/{template['id']}", json={"docker_entrypoint": None})
        assert r.status_code == 200, r.text
        assert r.json()["data"]["docker_entrypoint"] is None
        r = c.patch(f"/v1/templates/{template['id']}", json={"docker_entrypoint": ["a\u0000"]})
        v1_error(r, 400, "VALIDATION_ERROR")
