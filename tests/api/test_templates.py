"""Cluster templates over real HTTP: ``/v1/templates`` (REST v1 envelope, cursor pages,
errors), ``template_id`` on POST /v1/clusters, GraphQL ``saveTemplate`` /
``deleteTemplate`` / ``myself { podTemplates }`` / ``Pod.templateId``, and another
account's attempts at a template's ids, names and reads."""

from __future__ import annotations

import shlex
from typing import Any

import httpx

from gpuyard.api.rest.schemas import templates as schemas
from gpuyard.core.secret_env import MASK
from gpuyard.services.tenancy.auth import Scope, create_account, issue_key
from gpuyard.testing.fake_runtime import FakeRuntime
from tests.helpers import LiveServer

A6000 = "NVIDIA RTX A6000"
TEMPLATE = {
    "name": "jupyter",
    "docker_image": "runpod/pytorch:2.1",
    "docker_args": "sleep infinity",
    "env": {"MODE": "dev", "HF_TOKEN": "hf_secret", "OTHER": {"value": "o", "secret": True}},
    "ports": [{"internal_port": 8888, "protocol": "http"}],
    "container_disk_gb": 15,
    "volume_gb": 2,
    "volume_mount_path": "/data",
    "readme": "# Jupyter",
}


def other_key(srv: LiveServer, email: str = "b@example.com") -> str:
    with srv.server.ctx.transaction() as session:
        user, account, _ = create_account(session, email=email, name=email)
        return issue_key(
            session, user_id=user.id, account_id=account.id, name="b", scope=Scope.WRITE
        ).key


def ok(r: httpx.Response, status: int = 200) -> Any:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["success"] is True
    return body["data"]


def error(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["success"] is False
    err: dict[str, Any] = body["error"]
    return err


def test_rest_create_list_get_patch_delete(srv: LiveServer) -> None:
    with srv.client() as c:
        created = c.post("/v1/templates", json=TEMPLATE)
        schemas.TemplateEnvelope.model_validate(created.json())
        made = ok(created, 201)
        tid = made["id"]
        schemas.TemplateListEnvelope.model_validate(c.get("/v1/templates").json())
        assert made["env"] == {"MODE": "dev", "HF_TOKEN": MASK, "OTHER": MASK}
        assert made["is_public"] is False and made["readme"] == "# Jupyter"
        assert made["ports"][0]["internal_port"] == 8888
        assert ok(c.get(f"/v1/templates/{tid}")) == made

        listed = ok(c.get("/v1/templates"))
        assert [t["id"] for t in listed["templates"]] == [tid]
        assert listed["pagination"]["total"] == 1 and listed["pagination"]["next_cursor"] is None

        changed = ok(
            c.patch(
                f"/v1/templates/{tid}",
                json={"env": {"MODE": "prod", "HF_TOKEN": MASK}, "readme": "new"},
            )
        )
        assert changed["env"] == {"MODE": "prod", "HF_TOKEN": MASK}
        assert changed["readme"] == "new" and changed["docker_image"] == TEMPLATE["docker_image"]

        deleted = c.delete(f"/v1/templates/{tid}")
        schemas.TemplateDeletedEnvelope.model_validate(deleted.json())
        assert ok(deleted) == {"id": tid, "deleted": True}
        assert error(c.get(f"/v1/templates/{tid}"), 404)["code"] == "TEMPLATE_NOT_FOUND"


def test_rest_pages_by_cursor(srv: LiveServer) -> None:
    with srv.client() as c:
        ids = [
            ok(c.post("/v1/templates", json={"name": f"t{i}", "docker_image": "img"}), 201)["id"]
            for i in range(3)
        ]
        first = ok(c.get("/v1/templates", params={"per_page": 2}))
        assert len(first["templates"]) == 2 and first["pagination"]["total"] == 3
        cursor = first["pagination"]["next_cursor"]
        rest = ok(c.get("/v1/templates", params={"per_page": 2, "cursor": cursor}))
        assert [t["id"] for t in first["templates"] + rest["templates"]] == ids
        assert rest["pagination"]["next_cursor"] is None
        bad = error(c.get("/v1/templates", params={"cursor": "nonsense"}), 400)
        assert bad["code"] == "VALIDATION_ERROR"


def test_rest_bad_input_is_a_clear_error(srv: LiveServer) -> None:
    with srv.client() as c:
        ok(c.post("/v1/templates", json={"name": "dup", "docker_image": "img"}), 201)
        taken = error(c.post("/v1/templates", json={"name": "dup", "docker_image": "img"}), 409)
        assert taken["code"] == "TEMPLATE_EXISTS"
        for body in (
            {"docker_image": "img"},
            {"name": "x"},
            {"name": "x", "docker_image": "img", "is_public": True},
            {"name": "x", "docker_image": "img", "volume_gb": -1},
            {"name": "x", "docker_image": "img", "volume_mount_path": "/proc"},
            {"name": "x", "docker_image": "img", "env": {"A": 1}},
            {"name": "x", "docker_image": "img", "nope": 1},
            {"name": "x\u202e", "docker_image": "img"},
            # Only registries the operator allows, as on a cluster create.
            {"name": "x", "docker_image": "evil.example.com/x"},
            {"name": "x", "docker_image": "127.0.0.1:8765/x"},
        ):
            r = c.post("/v1/templates", json=body)
            assert r.status_code == 400, (body, r.text)
            assert r.json()["error"]["code"] == "VALIDATION_ERROR"
        dup_id = ok(c.get("/v1/templates"))["templates"][0]["id"]
        moved = c.patch(f"/v1/templates/{dup_id}", json={"docker_image": "10.0.0.5/x"})
        assert error(moved, 400)["details"]["field"] == "docker_image"
        long_id = "x" * 300
        assert c.get(f"/v1/templates/{long_id}").status_code in (400, 404)
        assert error(c.patch("/v1/templates/nothing", json={}), 404)["code"] == "TEMPLATE_NOT_FOUND"


def test_rest_cluster_from_a_template(srv: LiveServer) -> None:
    with srv.client() as c:
        tid = ok(c.post("/v1/templates", json=TEMPLATE), 201)["id"]
        cluster = ok(
            c.post(
                "/v1/clusters",
                json={"template_id": tid, "gpu_type": A6000, "env": {"MODE": "prod"}},
            ),
            201,
        )
        assert cluster["docker_image"] == TEMPLATE["docker_image"] and cluster["template_id"] == tid
        assert cluster["volume_mount_path"] == "/data" and cluster["container_disk_gb"] == 15
        assert cluster["env"] == {"MODE": "prod", "HF_TOKEN": MASK, "OTHER": MASK}
        assert srv.server.reconciler.wait_idle(10)
        pod = srv.graphql(
            "query($id: String!) { pod(input: {podId: $id}) { templateId imageName } }",
            {"id": cluster["id"]},
        )["data"]["pod"]
        assert pod == {"templateId": tid, "imageName": TEMPLATE["docker_image"]}
        no_image = error(c.post("/v1/clusters", json={"gpu_type": A6000}), 400)
        assert "docker_image" in no_image["message"]
        unknown = error(c.post("/v1/clusters", json={"template_id": "nothing"}), 400)
        assert unknown["details"]["field"] == "template_id"


def test_another_account_cannot_reach_a_template(srv: LiveServer) -> None:
    with srv.client() as c:
        tid = ok(c.post("/v1/templates", json=TEMPLATE), 201)["id"]
    theirs = other_key(srv)
    with srv.client(theirs) as b:
        for r in (
            b.get(f"/v1/templates/{tid}"),
            b.patch(f"/v1/templates/{tid}", json={"name": "mine"}),
            b.delete(f"/v1/templates/{tid}"),
        ):
            assert error(r, 404)["code"] == "TEMPLATE_NOT_FOUND"
        assert ok(b.get("/v1/templates"))["templates"] == []
        used = error(b.post("/v1/clusters", json={"template_id": tid, "gpu_type": A6000}), 400)
        assert used["details"]["field"] == "template_id"
        # The same name is free in another account.
        ok(b.post("/v1/templates", json={"name": TEMPLATE["name"], "docker_image": "i"}), 201)
    gone = srv.graphql('mutation { deleteTemplate(templateName: "jupyter") }', key=theirs)
    assert "errors" not in gone  # their own template of that name
    again = srv.graphql('mutation { deleteTemplate(templateName: "jupyter") }', key=theirs)
    assert again["errors"][0]["extensions"]["code"] == "TEMPLATE_NOT_FOUND"
    update = srv.graphql(
        f'mutation {{ saveTemplate(input: {{id: "{tid}", name: "x"}}) {{ id }} }}', key=theirs
    )
    assert update["errors"][0]["extensions"]["code"] == "TEMPLATE_NOT_FOUND"
    listed = srv.graphql("{ myself { podTemplates { id } } }", key=theirs)
    assert listed["data"]["myself"]["podTemplates"] == []
    with srv.client() as c:
        assert ok(c.get(f"/v1/templates/{tid}"))["name"] == "jupyter"


SAVE = """mutation($name: String!) { saveTemplate(input: {
  name: $name, imageName: "img:2", dockerArgs: "run", containerDiskInGb: 12, volumeInGb: 3,
  volumeMountPath: "/w", ports: "8888/http,22/tcp",
  env: [{key: "A", value: "1"}, {key: "DB_PASSWORD", value: "pw"}],
  isServerless: false, isPublic: false, readme: "hi", containerRegistryAuthId: ""
}) { id name imageName dockerArgs containerDiskInGb volumeInGb volumeMountPath ports
     env { key value } isServerless isPublic readme containerRegistryAuthId } }"""


def test_graphql_save_update_list_delete_and_deploy(srv: LiveServer) -> None:
    saved = srv.graphql(SAVE, {"name": "gql"})["data"]["saveTemplate"]
    tid = saved["id"]
    assert saved["ports"] == "8888/http,22/tcp" and saved["volumeMountPath"] == "/w"
    assert saved["env"] == [{"key": "A", "value": "1"}, {"key": "DB_PASSWORD", "value": MASK}]
    assert saved["isPublic"] is False and saved["containerRegistryAuthId"] is None
    updated = srv.graphql(
        f'mutation {{ saveTemplate(input: {{id: "{tid}", readme: "new"}}) '
        "{ id readme imageName } }"
    )["data"]["saveTemplate"]
    assert updated == {"id": tid, "readme": "new", "imageName": "img:2"}
    listed = srv.graphql("{ myself { podTemplates { id name } } }")["data"]["myself"]
    assert listed["podTemplates"] == [{"id": tid, "name": "gql"}]

    dup = srv.graphql(SAVE, {"name": "gql"})
    assert dup["errors"][0]["extensions"]["code"] == "TEMPLATE_EXISTS"
    public = srv.graphql(
        'mutation { saveTemplate(input: {name: "p", imageName: "i", isPublic: true}) { id } }'
    )
    assert public["errors"][0]["extensions"]["code"] == "VALIDATION_ERROR"

    for mutation in ("podFindAndDeployOnDemand", "clusterFindAndDeployOnDemand"):
        pod = srv.graphql(
            f'mutation {{ {mutation}(input: {{gpuTypeId: "{A6000}", templateId: "{tid}", '
            "volumeInGb: 1}) { id imageName dockerArgs volumeInGb volumeMountPath ports "
            "templateId } }"
        )["data"][mutation]
        assert pod["imageName"] == "img:2" and pod["dockerArgs"] == "run"
        assert pod["volumeInGb"] == 1 and pod["volumeMountPath"] == "/w"
        assert pod["ports"] == "8888/http,22/tcp" and pod["templateId"] == tid
        assert srv.server.reconciler.wait_idle(10)
    spot = srv.graphql(
        f'mutation {{ podRentInterruptable(input: {{gpuTypeId: "{A6000}", templateId: "{tid}", '
        "bidPerGpu: 5}) { templateId imageName } }"
    )["data"]["podRentInterruptable"]
    assert spot == {"templateId": tid, "imageName": "img:2"}
    unknown = srv.graphql(
        f'mutation {{ podFindAndDeployOnDemand(input: {{gpuTypeId: "{A6000}", '
        'templateId: "nothing"}) { id } }'
    )
    assert unknown["errors"][0]["extensions"]["code"] == "VALIDATION_ERROR"
    assert "templateId" in unknown["errors"][0]["message"]

    assert srv.graphql('mutation { deleteTemplate(templateName: "gql") }')["data"] == {
        "deleteTemplate": None
    }
    assert srv.graphql("{ myself { podTemplates { id } } }")["data"]["myself"]["podTemplates"] == []


def test_registry_credentials_are_checked_and_inherited(srv: LiveServer) -> None:
    """A template's container_registry_auth_id must be the account's (checked at each
    save); a cluster made from it is pulled with them unless its create names its
    own (null: none)."""
    with srv.client() as c:
        auth = ok(
            c.post("/v1/registry-auths", json={"name": "r", "username": "u", "password": "p"}),
            201,
        )
        other_auth = ok(
            c.post("/v1/registry-auths", json={"name": "r2", "username": "u", "password": "p"}),
            201,
        )
        for bad in ("999999", "abc", "-1", "1.0"):
            r = c.post("/v1/templates", json={**TEMPLATE, "container_registry_auth_id": bad})
            err = error(r, 400)
            assert err["code"] == "VALIDATION_ERROR", bad
            assert err["details"]["field"] == "container_registry_auth_id", bad
        body = {**TEMPLATE, "container_registry_auth_id": str(auth["id"])}
        made = ok(c.post("/v1/templates", json=body), 201)
        assert made["container_registry_auth_id"] == str(auth["id"])
        tid = made["id"]
        bad_patch = c.patch(f"/v1/templates/{tid}", json={"container_registry_auth_id": "999999"})
        assert error(bad_patch, 400)["details"]["field"] == "container_registry_auth_id"

        inherited = ok(c.post("/v1/clusters", json={"template_id": tid, "gpu_count": 0}), 201)
        assert inherited["registry_auth_id"] == auth["id"]
        own = {"template_id": tid, "gpu_count": 0, "registry_auth_id": other_auth["id"]}
        assert ok(c.post("/v1/clusters", json=own), 201)["registry_auth_id"] == other_auth["id"]
        none = {"template_id": tid, "gpu_count": 0, "registry_auth_id": None}
        assert ok(c.post("/v1/clusters", json=none), 201)["registry_auth_id"] is None
        # GraphQL's deploy without containerRegistryAuthId ("" as absent) inherits too.
        deploy = srv.graphql(
            "mutation($t: String!) { podFindAndDeployOnDemand(input: {templateId: $t, gpuCount: 0,"
            ' containerRegistryAuthId: ""}) { id containerRegistryAuthId } }',
            {"t": tid},
        )
        assert deploy["data"]["podFindAndDeployOnDemand"]["containerRegistryAuthId"] == str(
            auth["id"]
        ), deploy
        cleared = ok(c.patch(f"/v1/templates/{tid}", json={"container_registry_auth_id": None}))
        assert cleared["container_registry_auth_id"] is None
        plain = ok(c.post("/v1/clusters", json={"template_id": tid, "gpu_count": 0}), 201)
        assert plain["registry_auth_id"] is None


def test_start_script_is_the_command_without_docker_args(
    srv: LiveServer, fake_runtime: FakeRuntime
) -> None:
    script = "#!/bin/sh\necho 'ready' > /tmp/ready\nexec sleep infinity\n"
    with srv.client() as c:
        body = {**TEMPLATE, "name": "scripted", "docker_args": "", "start_script": script}
        tid = ok(c.post("/v1/templates", json=body), 201)["id"]
        cluster = ok(c.post("/v1/clusters", json={"template_id": tid, "gpu_count": 0}), 201)
        assert cluster["docker_args"] == shlex.join(["/bin/sh", "-c", script])
        assert srv.server.reconciler.wait_idle(10)
        spec = fake_runtime.containers[cluster["id"]].spec
        assert spec.command == ("/bin/sh", "-c", script)
        # Docker args of the create (or of the template) win; the script is not run.
        own = {"template_id": tid, "gpu_count": 0, "docker_args": "sleep 5"}
        assert ok(c.post("/v1/clusters", json=own), 201)["docker_args"] == "sleep 5"
        ok(c.patch(f"/v1/templates/{tid}", json={"docker_args": "python serve.py"}))
        args = ok(c.post("/v1/clusters", json={"template_id": tid, "gpu_count": 0}), 201)
        assert args["docker_args"] == "python serve.py"


def test_is_serverless_is_stored_and_answered(srv: LiveServer) -> None:
    with srv.client() as c:
        made = ok(c.post("/v1/templates", json={**TEMPLATE, "is_serverless": True}), 201)
        assert made["is_serverless"] is True
        schemas.TemplateEnvelope.model_validate(c.get(f"/v1/templates/{made['id']}").json())
        changed = ok(c.patch(f"/v1/templates/{made['id']}", json={"is_serverless": False}))
        assert changed["is_serverless"] is False
        bad = c.post("/v1/templates", json={**TEMPLATE, "name": "n", "is_serverless": "yes"})
        assert error(bad, 400)["code"] == "VALIDATION_ERROR"
