"""Secret env values over HTTP: every answer (REST v1 create/get/list, v2, GraphQL)
shows them masked, an explicit ``secret: true`` masks any name, a masked value sent
back keeps the secret, and the container still gets the plaintext."""

from __future__ import annotations

from typing import Any

import httpx

from gpuyard.core.secret_env import MASK
from gpuyard.core.tls_trust import trusted_tls
from gpuyard.testing.fake_runtime import FakeRuntime
from tests.helpers import LiveServer

PASSWORD = "hunter2-rest-password"
HUB = "hf-hub-explicit-secret"


def create_v1(srv: LiveServer, c: httpx.Client, env: dict[str, Any]) -> dict[str, Any]:
    r = c.post("/v1/clusters", json={"docker_image": "pytorch:2.1", "gpu_count": 0, "env": env})
    assert r.status_code == 201, r.text
    data: dict[str, Any] = r.json()["data"]
    assert srv.server.reconciler.wait_idle(10)
    return data


def graphql(srv: LiveServer, query: str) -> dict[str, Any]:
    body = srv.graphql(query)
    assert "errors" not in body, body
    data: dict[str, Any] = body["data"]
    return data


def test_rest_and_graphql_answers_mask_secrets(srv: LiveServer, fake_runtime: FakeRuntime) -> None:
    with srv.client() as c:
        created = create_v1(
            srv,
            c,
            {"DB_PASSWORD": PASSWORD, "HF_HUB": {"value": HUB, "secret": True}, "MODE": "dev"},
        )
        cid = created["id"]
        shown = {"DB_PASSWORD": MASK, "HF_HUB": MASK, "MODE": "dev"}
        assert created["env"] == shown
        got = c.get(f"/v1/clusters/{cid}")
        assert got.status_code == 200 and got.json()["data"]["env"] == shown
        listed = c.get("/v1/clusters").json()["data"]["clusters"]
        assert [x["env"] for x in listed if x["id"] == cid] == [shown]
        answers = [created, got.text, listed, c.get(f"/v2/clusters/{cid}").text]
        pod = graphql(srv, f'query {{ pod(input: {{podId: "{cid}"}}) {{ env }} }}')["pod"]
        assert sorted(pod["env"]) == [f"DB_PASSWORD={MASK}", f"HF_HUB={MASK}", "MODE=dev"]
        answers.append(pod)
        assert not any(PASSWORD in str(a) or HUB in str(a) for a in answers)
    env = fake_runtime.containers[cid].spec.env
    assert env["DB_PASSWORD"] == PASSWORD and env["HF_HUB"] == HUB


def test_graphql_secret_flag_masks_any_name(srv: LiveServer, fake_runtime: FakeRuntime) -> None:
    data = graphql(
        srv,
        'mutation { podFindAndDeployOnDemand(input: {gpuCount: 0, imageName: "pytorch:2.1", '
        f'env: [{{key: "HF_HUB", value: "{HUB}", secret: true}}, '
        '{key: "MODE", value: "dev", secret: false}]}) { id env } }',
    )["podFindAndDeployOnDemand"]
    assert sorted(data["env"]) == [f"HF_HUB={MASK}", "MODE=dev"]
    assert srv.server.reconciler.wait_idle(10)
    assert fake_runtime.containers[data["id"]].spec.env["HF_HUB"] == HUB


def test_updating_with_the_masked_value_keeps_the_secret(
    srv: LiveServer, fake_runtime: FakeRuntime
) -> None:
    with srv.client() as c:
        created = create_v1(
            srv, c, {"DB_PASSWORD": PASSWORD, "HF_HUB": {"value": HUB, "secret": True}}
        )
        cid = created["id"]
        assert c.post(f"/v1/clusters/{cid}/stop").status_code == 200
        assert srv.server.reconciler.wait_idle(10)
        # Read-modify-write: the env as read (masked) goes back with one change.
        env = {**c.get(f"/v1/clusters/{cid}").json()["data"]["env"], "EXTRA": "1"}
        r = c.post(
            f"/v1/clusters/{cid}/start",
            json={"wait_for_ready": True, "environment_updates": env},
        )
        assert r.status_code == 200, r.text
        assert r.json()["data"]["env"] == {"DB_PASSWORD": MASK, "HF_HUB": MASK, "EXTRA": "1"}
        assert srv.server.reconciler.wait_idle(10)
        spec = fake_runtime.containers[cid].spec.env
        assert (spec["DB_PASSWORD"], spec["HF_HUB"], spec["EXTRA"]) == (PASSWORD, HUB, "1")
        # A marked update of a plain name: masked from then on.
        assert c.post(f"/v1/clusters/{cid}/stop").status_code == 200
        assert srv.server.reconciler.wait_idle(10)
        r = c.post(
            f"/v1/clusters/{cid}/start",
            json={"environment_updates": {"EXTRA": {"value": "s3", "secret": True}}},
        )
        assert r.status_code == 200, r.text
        assert r.json()["data"]["env"]["EXTRA"] == MASK


def test_malformed_secret_objects_are_400(srv: LiveServer) -> None:
    bad = [
        {"X": {"secret": True}},
        {"X": {"value": 1, "secret": True}},
        {"X": {"value": "v", "secret": "yes"}},
        {"X": {"value": "v", "other": 1}},
    ]
    with srv.client() as c:
        for env in bad:
            r = c.post("/v1/clusters", json={"docker_image": "pytorch:2.1", "env": env})
            assert r.status_code == 400, (env, r.text)
            assert r.json()["error"]["code"] == "VALIDATION_ERROR"


def test_openapi_documents_the_secret_form(srv: LiveServer) -> None:
    doc = httpx.get(f"{srv.url}/openapi.json", timeout=60, verify=trusted_tls()).json()
    text = str(doc["components"]["schemas"]["CreateCluster"]["properties"]["env"])
    assert "'secret'" in text and "'boolean'" in text
