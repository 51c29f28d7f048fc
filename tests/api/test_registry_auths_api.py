"""Registry credentials over real HTTP: REST ``/v1/registry-auths`` (create, list,
update, delete) and GraphQL's ``saveRegistryAuth`` / ``updateRegistryAuth`` /
``deleteRegistryAuth`` / ``containerRegistryAuthId``; the password in no answer,
another account's credentials unknown to it, credentials in use not deleted."""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner

from gpuyard.api.rest.schemas import resources as rs
from gpuyard.cli.main import cli
from gpuyard.runtimes.engines.pull_errors import CREDENTIALS_NEEDED
from gpuyard.runtimes.records import RegistryCredentials
from gpuyard.services.tenancy.auth import Scope, create_account, issue_key
from gpuyard.testing.fake_runtime import FakeRuntime
from tests.helpers import LiveServer
from tests.required_parts import need_module

PASSWORD = "s3cret-registry-token-value"
IMAGE = "ghcr.io/acme/private:1"


def other_key(srv: LiveServer, email: str = "other@example.com") -> str:
    with srv.server.ctx.transaction() as session:
        user, account, _ = create_account(session, email=email, name="other")
        return issue_key(
            session, user_id=user.id, account_id=account.id, name="k", scope=Scope.WRITE
        ).key


def deploy_query(image: str, auth_id: object = None) -> str:
    auth = "" if auth_id is None else f', containerRegistryAuthId: "{auth_id}"'
    return (
        f'mutation {{ podFindAndDeployOnDemand(input: {{gpuCount: 0, imageName: "{image}"{auth}}}) '
        "{ id containerRegistryAuthId } }"
    )


def gql(srv: LiveServer, query: str, key: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = srv.graphql(query, key=key)
    return body


def test_rest_create_list_delete_never_answers_the_password(srv: LiveServer) -> None:
    with srv.client() as c:
        r = c.post(
            "/v1/registry-auths", json={"name": "ghcr", "username": "bot", "password": PASSWORD}
        )
        assert r.status_code == 201, r.text
        created = r.json()["data"]
        assert set(created) == {"id", "name", "created_at"} and created["name"] == "ghcr"
        again = c.post(
            "/v1/registry-auths", json={"name": "ghcr", "username": "x", "password": "y"}
        )
        assert again.status_code == 409
        assert again.json()["error"]["code"] == "REGISTRY_AUTH_EXISTS"
        listed = c.get("/v1/registry-auths")
        assert listed.status_code == 200
        assert [a["id"] for a in listed.json()["data"]["registry_auths"]] == [created["id"]]
        gone = c.delete(f"/v1/registry-auths/{created['id']}")
        assert gone.status_code == 200 and gone.json()["data"] == {
            "id": created["id"],
            "deleted": True,
        }
        missing = c.delete(f"/v1/registry-auths/{created['id']}")
        assert missing.status_code == 404
        assert missing.json()["error"]["code"] == "REGISTRY_AUTH_NOT_FOUND"
        for text in (r.text, again.text, listed.text, gone.text, missing.text):
            assert PASSWORD not in text and "bot" not in text


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"name": "n", "username": "u"},
        {"name": "", "username": "u", "password": "p"},
        {"name": "n", "username": "u", "password": 5},
        {"name": "n", "username": "u", "password": "p", "extra": 1},
        {"name": "a\u202eb", "username": "u", "password": "p"},
    ],
)
def test_bad_bodies_answer_a_validation_error(srv: LiveServer, body: dict[str, Any]) -> None:
    with srv.client() as c:
        r = c.post("/v1/registry-auths", json=body)
    assert r.status_code in (400, 422), r.text
    assert r.json()["success"] is False


def test_bad_ids_answer_not_found_or_validation(srv: LiveServer) -> None:
    with srv.client() as c:
        for path in ("/v1/registry-auths/0", "/v1/registry-auths/abc", "/v1/registry-auths/9" * 3):
            r = c.delete(path)
            assert r.status_code in (400, 404, 405), (path, r.text)
        r = c.post(
            "/v1/clusters",
            json={"docker_image": "img", "gpu_count": 0, "registry_auth_id": "1"},
        )
        assert r.status_code in (400, 422) and r.json()["success"] is False


def test_another_account_cannot_use_list_or_delete_them(
    srv: LiveServer, fake_runtime: FakeRuntime
) -> None:
    with srv.client() as c:
        mine = c.post(
            "/v1/registry-auths", json={"name": "mine", "username": "u", "password": PASSWORD}
        ).json()["data"]
    other = other_key(srv)
    with srv.client(other) as c:
        assert c.get("/v1/registry-auths").json()["data"]["registry_auths"] == []
        r = c.delete(f"/v1/registry-auths/{mine['id']}")
        unknown = c.delete("/v1/registry-auths/999999")
        assert r.status_code == unknown.status_code == 404
        assert r.json()["error"]["code"] == unknown.json()["error"]["code"]
        body = {"docker_image": IMAGE, "gpu_count": 0, "registry_auth_id": mine["id"]}
        r = c.post("/v1/clusters", json=body)
        none = c.post("/v1/clusters", json={**body, "registry_auth_id": 999_999})
        assert r.status_code == none.status_code == 400
        assert r.json()["error"]["code"] == "VALIDATION_ERROR"
        assert r.json()["error"]["details"]["field"] == "registry_auth_id"
        assert r.json()["error"]["message"].replace(str(mine["id"]), "N") == none.json()["error"][
            "message"
        ].replace("999999", "N")
        r = c.patch(f"/v1/registry-auths/{mine['id']}", json={"password": "stolen"})
        unknown = c.patch("/v1/registry-auths/999999", json={"password": "stolen"})
        assert r.status_code == unknown.status_code == 404
        assert r.json()["error"]["code"] == unknown.json()["error"]["code"]
        template = {"name": "t", "docker_image": IMAGE, "container_registry_auth_id": mine["id"]}
        r = c.post(
            "/v1/templates", json={**template, "container_registry_auth_id": str(mine["id"])}
        )
        assert r.status_code == 400, r.text
        assert r.json()["error"]["details"]["field"] == "container_registry_auth_id"
    body = gql(srv, deploy_query(IMAGE, mine["id"]), key=other)
    assert body["errors"][0]["extensions"]["code"] == "VALIDATION_ERROR"
    assert "containerRegistryAuthId" in str(body["errors"][0])
    body = gql(srv, f'mutation {{ deleteRegistryAuth(registryAuthId: "{mine["id"]}") }}', other)
    assert body["errors"][0]["extensions"]["code"] == "REGISTRY_AUTH_NOT_FOUND"
    with srv.client() as c:
        assert [a["id"] for a in c.get("/v1/registry-auths").json()["data"]["registry_auths"]] == [
            mine["id"]
        ]


def test_graphql_save_deploy_and_delete(srv: LiveServer, fake_runtime: FakeRuntime) -> None:
    fake_runtime.private_images[IMAGE] = RegistryCredentials("bot", PASSWORD)
    save = (
        'mutation { saveRegistryAuth(input: {name: "ghcr", username: "bot", '
        f'password: "{PASSWORD}"}}) {{ id name }} }}'
    )
    body = gql(srv, save)
    assert "errors" not in body, body
    auth = body["data"]["saveRegistryAuth"]
    assert auth["name"] == "ghcr" and PASSWORD not in str(body)
    body = gql(srv, deploy_query(IMAGE, auth["id"]))
    assert "errors" not in body, body
    pod = body["data"]["podFindAndDeployOnDemand"]
    assert pod["containerRegistryAuthId"] == auth["id"]
    assert srv.server.reconciler.wait_idle(10)
    with srv.client() as c:
        got = c.get(f"/v1/clusters/{pod['id']}").json()["data"]
        assert got["status"] == "running", got
        assert got["registry_auth_id"] == int(auth["id"])
    assert (IMAGE, RegistryCredentials("bot", PASSWORD)) in fake_runtime.pull_credentials
    # Without credentials the pull fails with the fixed message, though the image is
    # on the host from the pull with them: the registry is asked again.
    body = gql(srv, deploy_query(IMAGE))
    bare = body["data"]["podFindAndDeployOnDemand"]
    assert bare["containerRegistryAuthId"] is None
    assert srv.server.reconciler.wait_idle(10)
    with srv.client() as c:
        failed = c.get(f"/v1/clusters/{bare['id']}").json()["data"]
        assert failed["status"] == "error"
        assert CREDENTIALS_NEEDED in str(failed)
    delete = f'mutation {{ deleteRegistryAuth(registryAuthId: "{auth["id"]}") }}'
    # Refused while the running pod names them.
    body = gql(srv, delete)
    assert body["errors"][0]["extensions"]["code"] == "REGISTRY_AUTH_IN_USE", body
    assert pod["id"] in body["errors"][0]["message"]
    with srv.client() as c:
        assert c.delete(f"/v1/clusters/{pod['id']}").status_code in (200, 202)
    assert srv.server.reconciler.wait_idle(10)
    body = gql(srv, delete)
    assert body == {"data": {"deleteRegistryAuth": True}}
    body = gql(srv, 'mutation { deleteRegistryAuth(registryAuthId: "nope") }')
    assert body["errors"][0]["extensions"]["code"] == "VALIDATION_ERROR"
    body = gql(
        srv, 'mutation { saveRegistryAuth(input: {name: "", username: "u", password: "p"}) { id } }'
    )
    assert body["errors"][0]["extensions"]["code"] == "VALIDATION_ERROR"


def test_the_runpod_sdk_creates_and_deletes_them(
    srv: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    runpod = need_module("runpod", how="pip install runpod (make venv)")
    monkeypatch.setenv("RUNPOD_API_BASE_URL", srv.url)
    monkeypatch.setattr(runpod, "api_key", srv.key)
    saved = runpod.create_container_registry_auth("sdk", "bot", PASSWORD)
    assert saved["name"] == "sdk" and set(saved) == {"id", "name"}
    updated = runpod.update_container_registry_auth(saved["id"], "bot2", "new-" + PASSWORD)
    assert updated == {"id": saved["id"], "name": "sdk"}
    # Another account's update is the same not-found as an unknown id.
    update = (
        'mutation { updateRegistryAuth(input: {id: "%s", username: "x", password: "y"}) { id } }'
    )
    theirs = gql(srv, update.replace("%s", saved["id"]), key=other_key(srv))
    assert theirs["errors"][0]["extensions"]["code"] == "REGISTRY_AUTH_NOT_FOUND"
    runpod.delete_container_registry_auth(saved["id"])
    with srv.client() as c:
        assert c.get("/v1/registry-auths").json()["data"]["registry_auths"] == []


def test_cli_registry_auths(srv: LiveServer, fake_runtime: FakeRuntime) -> None:
    env = {
        "GPUYARD_URL": srv.url,
        "GPUYARD_API_KEY": srv.key,
        "GPUYARD_HOME": str(srv.server.ctx.settings.home),
    }
    runner = CliRunner()
    made = runner.invoke(
        cli,
        ["registry-auths", "create", "cli", "--username", "bot", "--password-stdin", "--json"],
        input=PASSWORD + "\n",
        env=env,
    )
    assert made.exit_code == 0, made.output
    auth = json.loads(made.stdout)
    assert PASSWORD not in made.output
    table = runner.invoke(cli, ["registry-auths", "list"], env=env)
    assert table.exit_code == 0 and "cli" in table.stdout and PASSWORD not in table.stdout
    fake_runtime.private_images[IMAGE] = RegistryCredentials("bot", PASSWORD)
    created = runner.invoke(
        cli,
        ["clusters", "create", "--image", IMAGE, "--registry-auth", str(auth["id"]), "--json"],
        env=env,
    )
    assert created.exit_code == 0, created.output
    assert json.loads(created.stdout)["registry_auth_id"] == auth["id"]
    cid = json.loads(created.stdout)["id"]
    busy = runner.invoke(cli, ["registry-auths", "delete", str(auth["id"])], env=env)
    assert busy.exit_code != 0 and "REGISTRY_AUTH_IN_USE" in busy.output and cid in busy.output
    changed = runner.invoke(
        cli,
        ["registry-auths", "update", str(auth["id"]), "--name", "cli2", "--password-stdin"],
        input="new-" + PASSWORD + "\n",
        env=env,
    )
    assert changed.exit_code == 0, changed.output
    assert "cli2" in changed.stdout and PASSWORD not in changed.output
    assert runner.invoke(cli, ["clusters", "terminate", cid], env=env).exit_code == 0
    assert srv.server.reconciler.wait_idle(10)
    gone = runner.invoke(cli, ["registry-auths", "delete", str(auth["id"])], env=env)
    assert gone.exit_code == 0, gone.output
    with srv.client() as c:
        assert c.get("/v1/registry-auths").json()["data"]["registry_auths"] == []


def test_rest_update_changes_fields_sent_and_never_answers_the_password(
    srv: LiveServer, fake_runtime: FakeRuntime
) -> None:
    fake_runtime.private_images[IMAGE] = RegistryCredentials("bot2", "new-" + PASSWORD)
    with srv.client() as c:
        made = c.post("/v1/registry-auths", json={"name": "a", "username": "bot", "password": "x"})
        auth = made.json()["data"]
        c.post("/v1/registry-auths", json={"name": "taken", "username": "u", "password": "p"})
        r = c.patch(
            f"/v1/registry-auths/{auth['id']}",
            json={"username": "bot2", "password": "new-" + PASSWORD},
        )
        assert r.status_code == 200, r.text
        rs.RegistryAuthEnvelope.model_validate(r.json())
        assert r.json()["data"] == auth and PASSWORD not in r.text
        r = c.patch(f"/v1/registry-auths/{auth['id']}", json={"name": "renamed"})
        assert r.status_code == 200 and r.json()["data"]["name"] == "renamed"
        for bad, field in (
            ({}, "username"),
            ({"password": ""}, "password"),
            ({"name": " "}, "name"),
            ({"username": 5}, "username"),
            ({"secret": "x"}, "secret"),
        ):
            r = c.patch(f"/v1/registry-auths/{auth['id']}", json=bad)
            assert r.status_code in (400, 422), (bad, r.text)
            assert r.json()["error"]["code"] == "VALIDATION_ERROR", (bad, r.text)
            assert field in r.text, (bad, r.text)
        r = c.patch(f"/v1/registry-auths/{auth['id']}", json={"name": "taken"})
        assert r.status_code == 409 and r.json()["error"]["code"] == "REGISTRY_AUTH_EXISTS"
        # The next pull uses what was stored last.
        body = {"docker_image": IMAGE, "gpu_count": 0, "registry_auth_id": auth["id"]}
        cid = c.post("/v1/clusters", json=body).json()["data"]["id"]
        assert srv.server.reconciler.wait_idle(10)
        assert c.get(f"/v1/clusters/{cid}").json()["data"]["status"] == "running"
    assert (IMAGE, RegistryCredentials("bot2", "new-" + PASSWORD)) in fake_runtime.pull_credentials


def test_in_use_credentials_are_not_deleted(srv: LiveServer, fake_runtime: FakeRuntime) -> None:
    """Templates and live clusters that name credentials keep them from being deleted
    (409 naming them); a terminated cluster does not."""
    fake_runtime.private_images[IMAGE] = RegistryCredentials("bot", PASSWORD)
    with srv.client() as c:
        made = c.post(
            "/v1/registry-auths", json={"name": "a", "username": "bot", "password": PASSWORD}
        )
        aid = made.json()["data"]["id"]
        t = {"name": "t", "docker_image": IMAGE, "container_registry_auth_id": str(aid)}
        tid = c.post("/v1/templates", json=t).json()["data"]["id"]
        cluster = {"docker_image": IMAGE, "gpu_count": 0, "registry_auth_id": aid}
        cid = c.post("/v1/clusters", json=cluster).json()["data"]["id"]
        assert srv.server.reconciler.wait_idle(10)
        r = c.delete(f"/v1/registry-auths/{aid}")
        assert r.status_code == 409, r.text
        err = r.json()["error"]
        assert err["code"] == "REGISTRY_AUTH_IN_USE"
        assert err["details"]["template_ids"] == [tid] and err["details"]["cluster_ids"] == [cid]
        assert c.patch(f"/v1/templates/{tid}", json={"container_registry_auth_id": None}).is_success
        r = c.delete(f"/v1/registry-auths/{aid}")
        assert r.status_code == 409 and r.json()["error"]["details"]["template_ids"] == []
        assert c.delete(f"/v1/clusters/{cid}").is_success
        assert srv.server.reconciler.wait_idle(10)
        r = c.delete(f"/v1/registry-auths/{aid}")
        assert r.status_code == 200, r.text
