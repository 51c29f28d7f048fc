"""``/v1/secrets`` over real HTTP, and a secret referenced from a cluster's env: the
container gets the value; no answer (REST v1 and v2, GraphQL, events, audit trail,
the secrets' own routes) and no log line of gpuyard's ever holds it. Another account
neither sees the secret nor resolves its name. RunPod's SDK creates a pod whose env
refers to a secret; ``gpuyard secrets`` reads values from stdin or a file."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner, Result

from gpuyard.api.rest.schemas import secrets as schemas
from gpuyard.cli.main import cli
from gpuyard.services.tenancy.auth import Scope, create_account, issue_key
from gpuyard.testing.fake_runtime import FakeRuntime
from tests.helpers import LiveServer
from tests.required_parts import need_module

VALUE = "distinctive-Zq7vX1-secret-value"
REF = "{{ RUNPOD_SECRET_token }}"


def data(r: httpx.Response, status: int = 200) -> Any:
    assert r.status_code == status, r.text
    return r.json()["data"]


def error(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body: dict[str, Any] = r.json()
    assert body["success"] is False
    return dict(body["error"])


def other_tenant(srv: LiveServer) -> str:
    with srv.server.ctx.transaction() as s:
        owner, account, _ = create_account(s, email="owner@other.test", name="other")
        return issue_key(
            s, user_id=owner.id, account_id=account.id, name="o", scope=Scope.WRITE
        ).key


def test_secrets_crud_and_errors(srv: LiveServer) -> None:
    with srv.client() as c:
        r = c.post("/v1/secrets", json={"name": "token", "value": VALUE, "description": "d"})
        created = data(r, 201)
        schemas.SecretEnvelope.model_validate(r.json())
        assert created["name"] == "token" and created["reference"] == REF
        assert VALUE not in r.text
        sid = created["id"]
        listed = c.get("/v1/secrets")
        schemas.SecretListEnvelope.model_validate(listed.json())
        assert [x["id"] for x in data(listed)["secrets"]] == [sid]
        got = c.get(f"/v1/secrets/{sid}")
        schemas.SecretEnvelope.model_validate(got.json())
        patched = c.patch(f"/v1/secrets/{sid}", json={"value": "new-" + VALUE})
        schemas.SecretEnvelope.model_validate(patched.json())
        assert data(patched)["description"] == "d"
        assert not any(VALUE in x.text for x in (listed, got, patched))
        # Errors, each in the v1 envelope.
        assert (
            error(c.post("/v1/secrets", json={"name": "token", "value": "x"}), 409)["code"]
            == "SECRET_EXISTS"
        )
        bad = error(c.post("/v1/secrets", json={"name": "a b", "value": "x"}), 400)
        assert bad["code"] == "VALIDATION_ERROR" and bad["details"]["field"] == "name"
        assert error(c.post("/v1/secrets", json={"name": "e", "value": ""}), 400)
        assert error(c.post("/v1/secrets", json={"name": "n"}), 400)
        assert error(c.post("/v1/secrets", json={"name": 5, "value": "x"}), 400)
        assert error(c.post("/v1/secrets", json={"name": "n", "value": "x", "z": 1}), 400)
        assert error(
            c.post("/v1/secrets", content=b"{", headers={"content-type": "application/json"}), 400
        )
        assert error(c.patch(f"/v1/secrets/{sid}", json={"value": 3}), 400)
        assert error(c.get("/v1/secrets/0"), 400)
        assert error(c.get("/v1/secrets/999999"), 404)["code"] == "SECRET_NOT_FOUND"
        deleted = data(c.delete(f"/v1/secrets/{sid}"))
        assert deleted == {"id": sid, "deleted": True}
        assert error(c.get(f"/v1/secrets/{sid}"), 404)["code"] == "SECRET_NOT_FOUND"


def test_another_account_neither_sees_nor_resolves(srv: LiveServer) -> None:
    with srv.client() as c:
        sid = data(c.post("/v1/secrets", json={"name": "token", "value": VALUE}), 201)["id"]
    with srv.client(other_tenant(srv)) as o:
        assert data(o.get("/v1/secrets"))["secrets"] == []
        for r in (
            o.get(f"/v1/secrets/{sid}"),
            o.patch(f"/v1/secrets/{sid}", json={"value": "stolen"}),
            o.delete(f"/v1/secrets/{sid}"),
        ):
            assert error(r, 404)["code"] == "SECRET_NOT_FOUND"
        # Its cluster naming the first account's secret is refused, naming it.
        r = o.post("/v1/clusters", json={"docker_image": "img", "gpu_count": 0, "env": {"X": REF}})
        refused = error(r, 400)
        assert refused["details"]["field"] == "env" and "token" in refused["message"]
        assert refused["details"]["missing_secrets"] == ["token"]
    with srv.client() as c:
        assert data(c.get(f"/v1/secrets/{sid}"))["name"] == "token"


def test_the_value_reaches_the_container_and_no_answer_or_log(
    srv: LiveServer, fake_runtime: FakeRuntime, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    answers: list[str] = []
    with srv.client() as c:
        answers.append(c.post("/v1/secrets", json={"name": "token", "value": VALUE}).text)
        env = {"X": REF, "HF_TOKEN": "Bearer {{RUNPOD_SECRET_token}}", "PLAIN": "p"}
        r = c.post("/v1/clusters", json={"docker_image": "img", "gpu_count": 0, "env": env})
        created = data(r, 201)
        answers.append(r.text)
        cid = created["id"]
        assert created["env"] == env  # the references, shown as written
        assert srv.server.reconciler.wait_idle(10)
        got = fake_runtime.containers[cid].spec.env
        assert (got["X"], got["HF_TOKEN"]) == (VALUE, f"Bearer {VALUE}")
        # A restart and a stop/start resolve again.
        answers.append(c.post(f"/v1/clusters/{cid}/restart").text)
        assert srv.server.reconciler.wait_idle(10)
        answers.append(c.post(f"/v1/clusters/{cid}/stop").text)
        assert srv.server.reconciler.wait_idle(10)
        answers.append(c.post(f"/v1/clusters/{cid}/start", json={}).text)
        assert srv.server.reconciler.wait_idle(10)
        assert fake_runtime.containers[cid].spec.env["X"] == VALUE
        for path in (
            f"/v1/clusters/{cid}",
            "/v1/clusters",
            f"/v2/clusters/{cid}",
            f"/v1/clusters/{cid}/events",
            "/v1/audit-events",
            "/v1/secrets",
        ):
            r = c.get(path)
            assert r.status_code == 200, (path, r.text)
            answers.append(r.text)
        assert env == data(c.get(f"/v1/clusters/{cid}"))["env"]
    pod = srv.graphql(f'query {{ pod(input: {{podId: "{cid}"}}) {{ env }} }}')
    assert sorted(pod["data"]["pod"]["env"]) == sorted(f"{k}={v}" for k, v in env.items())
    answers.append(str(pod))
    me = srv.graphql("{ myself { pods { id env } clusters { id } } }")
    answers.append(str(me))
    leaks = [a[:200] for a in answers if VALUE in a]
    assert not leaks, leaks
    logged = [r.getMessage() for r in caplog.records if VALUE in r.getMessage()]
    assert not logged, logged


def test_graphql_pod_with_a_missing_secret_is_refused_naming_it(srv: LiveServer) -> None:
    body = srv.graphql(
        'mutation { podFindAndDeployOnDemand(input: {gpuCount: 0, imageName: "img", '
        'env: [{key: "X", value: "{{ RUNPOD_SECRET_nothere }}"}]}) { id } }'
    )
    assert body.get("errors"), body
    ext = body["errors"][0]["extensions"]
    assert ext["code"] == "VALIDATION_ERROR" and ext["details"]["missing_secrets"] == ["nothere"]


def test_runpod_sdk_creates_a_pod_whose_env_refers_to_a_secret(
    srv: LiveServer, fake_runtime: FakeRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    runpod = need_module("runpod", how="pip install runpod (make venv)")
    monkeypatch.setenv("RUNPOD_API_BASE_URL", srv.url)
    monkeypatch.setattr(runpod, "api_key", srv.key)
    with srv.client() as c:
        data(c.post("/v1/secrets", json={"name": "token", "value": VALUE}), 201)
    pod = runpod.create_pod("sdk-secret", "img", "NVIDIA RTX A6000", env={"X": REF})
    assert pod["env"] == [f"X={REF}"] and VALUE not in str(pod)
    assert srv.server.reconciler.wait_idle(10)
    assert fake_runtime.containers[pod["id"]].spec.env["X"] == VALUE
    assert VALUE not in str(runpod.get_pod(pod["id"]))


def test_cli_secrets_read_the_value_from_stdin_and_never_print_it(
    srv: LiveServer, fake_runtime: FakeRuntime, tmp_path: Path
) -> None:
    env = {"GPUYARD_URL": srv.url, "GPUYARD_API_KEY": srv.key}
    env["GPUYARD_HOME"] = str(srv.server.ctx.settings.home)

    def run(*args: str, stdin: str | None = None) -> Result:
        result = CliRunner().invoke(cli, list(args), env=env, input=stdin)
        assert result.exit_code == 0, result.output
        assert VALUE not in result.output
        return result

    created = run("secrets", "create", "token", "--description", "hub", stdin=VALUE + "\n")
    assert REF in created.output
    listed = json.loads(run("--json", "secrets", "list").stdout)["secrets"]
    assert [(s["name"], s["description"]) for s in listed] == [("token", "hub")]
    sid = str(listed[0]["id"])
    value_file = tmp_path / "value"
    value_file.write_text("from-a-file")
    run("secrets", "update", sid, "--value-file", str(value_file))
    run("secrets", "update", sid, "--description", "renamed")
    with srv.client() as c:
        body = {"docker_image": "img", "gpu_count": 0, "env": {"X": REF}}
        cid = data(c.post("/v1/clusters", json=body), 201)["id"]
        assert srv.server.reconciler.wait_idle(10)
        assert fake_runtime.containers[cid].spec.env["X"] == "from-a-file"
        assert data(c.get(f"/v1/secrets/{sid}"))["description"] == "renamed"
        assert c.delete(f"/v1/clusters/{cid}").status_code == 200
    run("secrets", "delete", sid)
    assert json.loads(run("--json", "secrets", "list").stdout)["secrets"] == []
