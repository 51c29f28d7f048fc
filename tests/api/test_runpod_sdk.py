"""RunPod's Python SDK (``pip install runpod``), unmodified, against gpuyard's GraphQL.

The SDK reads ``RUNPOD_API_BASE_URL`` on every call (runpod/api/graphql.py) and takes
its key from the module-level ``runpod.api_key``; the test sets both.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpuyard.runtimes.records import RegistryCredentials
from gpuyard.services.tenancy.auth import Scope, create_account, issue_key
from gpuyard.testing.fake_runtime import FakeRuntime
from tests.helpers import LiveServer
from tests.required_parts import need_module

runpod = need_module("runpod", how="pip install runpod (make venv)")


@pytest.fixture
def sdk(srv: LiveServer, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("RUNPOD_API_BASE_URL", srv.url)
    monkeypatch.setattr(runpod, "api_key", srv.key)
    return runpod


def test_sdk_lifecycle(srv: LiveServer, sdk: Any) -> None:
    gpus = sdk.get_gpus()
    assert {"id": "NVIDIA RTX A6000", "displayName": "RTX A6000", "memoryInGb": 48} in gpus
    gpu = sdk.get_gpu("NVIDIA RTX A6000", 2)
    assert gpu["maxGpuCount"] == 4 and gpu["secureCloud"] is True
    assert gpu["lowestPrice"]["uninterruptablePrice"] > 0
    with pytest.raises(ValueError):
        sdk.get_gpu("NVIDIA GeForce GTX 280")  # not in the catalog

    user = sdk.get_user()
    assert user["id"] and user["networkVolumes"] == []

    pod = sdk.create_pod(
        "sdk-pod",
        "runpod/pytorch:2.1",
        "NVIDIA RTX A6000",
        ports="8888/http,22/tcp",
        env={"A": "1"},
        volume_in_gb=5,
    )
    pid = pod["id"]
    assert pod["imageName"] == "runpod/pytorch:2.1" and pod["env"] == ["A=1"]
    assert pod["machine"]["podHostId"].startswith(pid)
    assert srv.server.reconciler.wait_idle(10)

    pods = sdk.get_pods()
    assert [p["id"] for p in pods] == [pid]
    mine = sdk.get_pod(pid)
    assert mine["desiredStatus"] == "RUNNING" and mine["volumeMountPath"] == "/runpod-volume"
    assert mine["ports"] == "8888/http,22/tcp" and mine["machine"]["gpuDisplayName"] == "RTX A6000"
    assert {p["privatePort"] for p in mine["runtime"]["ports"]} == {8888, 22}

    assert sdk.stop_pod(pid) == {"id": pid, "desiredStatus": "EXITED"}
    assert srv.server.reconciler.wait_idle(10)
    resumed = sdk.resume_pod(pid, 1)
    assert resumed["id"] == pid and resumed["desiredStatus"] == "RUNNING"
    assert srv.server.reconciler.wait_idle(10)
    assert sdk.get_pod(pid)["runtime"] is not None

    assert sdk.terminate_pod(pid) is None
    assert srv.server.reconciler.wait_idle(10)
    assert sdk.get_pods() == []
    assert sdk.get_pod(pid)["desiredStatus"] == "TERMINATED"

    cpu = sdk.create_pod("cpu", "busybox", instance_id="cpu3c-2-4")
    assert cpu["id"] and cpu["machine"]["podHostId"]


def test_sdk_errors(srv: LiveServer, sdk: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from runpod import error

    with pytest.raises(error.QueryError, match="not found"):
        sdk.stop_pod("nosuchpod00000")
    monkeypatch.setattr(runpod, "api_key", "gy_not_a_key")
    with pytest.raises(error.AuthenticationError):
        sdk.get_pods()


def test_sdk_templates(srv: LiveServer, sdk: Any) -> None:
    """runpod.create_template (``saveTemplate``), then runpod.create_pod with its id:
    the pod takes the template's image, args and ports; what create_pod sends wins."""
    template = sdk.create_template(
        "sdk-template",
        "runpod/pytorch:2.1",
        docker_start_cmd="sleep infinity",
        container_disk_in_gb=12,
        volume_in_gb=4,
        ports="8888/http,22/tcp",
        env={"MODE": "dev", "HF_TOKEN": "hf_x"},
    )
    tid = template["id"]
    assert template["name"] == "sdk-template" and template["isServerless"] is False
    assert template["imageName"] == "runpod/pytorch:2.1" and template["volumeInGb"] == 4
    assert template["env"] == [
        {"key": "MODE", "value": "dev"},
        {"key": "HF_TOKEN", "value": "********"},
    ]

    pod = sdk.create_pod("from-template", "", "NVIDIA RTX A6000", template_id=tid)
    assert pod["imageName"] == "runpod/pytorch:2.1"
    assert sorted(pod["env"]) == ["HF_TOKEN=********", "MODE=dev"]
    assert srv.server.reconciler.wait_idle(10)
    mine = sdk.get_pod(pod["id"])
    assert mine["ports"] == "8888/http,22/tcp" and mine["dockerArgs"] == "sleep infinity"
    # create_pod always sends volumeMountPath: the request's wins; the volumeInGb 0 it
    # sends counts as left out.
    assert mine["volumeMountPath"] == "/runpod-volume" and mine["containerDiskInGb"] == 12
    assert mine["volumeInGb"] == 4
    with pytest.raises(sdk.error.QueryError, match="templateId"):
        sdk.create_pod("nope", "", "NVIDIA RTX A6000", template_id="nosuchtemplate")


def _other_key(srv: LiveServer) -> str:
    with srv.server.ctx.transaction() as session:
        user, account, _ = create_account(session, email="sdk-b@example.com", name="sdk-b")
        return issue_key(
            session, user_id=user.id, account_id=account.id, name="b", scope=Scope.WRITE
        ).key


def test_sdk_registry_auths_and_a_template_that_names_them(
    srv: LiveServer, sdk: Any, fake_runtime: FakeRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """create/update/delete_container_registry_auth, create_template with
    registry_auth_id and is_serverless, create_pod from that template: each checked
    through /v1; another account's key can neither update nor delete them."""
    image = "ghcr.io/acme/private:2"
    saved = sdk.create_container_registry_auth("sdk-ghcr", "bot", "first-token")
    assert set(saved) == {"id", "name"} and saved["name"] == "sdk-ghcr"
    updated = sdk.update_container_registry_auth(saved["id"], "bot2", "second-token")
    assert updated == saved
    with srv.client() as c:
        listed = c.get("/v1/registry-auths").json()["data"]["registry_auths"]
        assert [(str(a["id"]), a["name"]) for a in listed] == [(saved["id"], "sdk-ghcr")]
        assert "token" not in str(listed)

    template = sdk.create_template(
        "private-template", image, ports="8888/http", registry_auth_id=saved["id"]
    )
    assert template["isServerless"] is False
    serverless = sdk.create_template("worker", image, is_serverless=True)
    assert serverless["isServerless"] is True and serverless["volumeInGb"] == 0
    with srv.client() as c:
        got = c.get(f"/v1/templates/{template['id']}").json()["data"]
        assert got["container_registry_auth_id"] == saved["id"] and got["is_serverless"] is False
        worker = c.get(f"/v1/templates/{serverless['id']}").json()["data"]
        assert worker["is_serverless"] is True

    # The pod from the template is pulled with the updated credentials.
    fake_runtime.private_images[image] = RegistryCredentials("bot2", "second-token")
    pod = sdk.create_pod("private-pod", "", "NVIDIA RTX A6000", template_id=template["id"])
    assert pod["imageName"] == image
    assert srv.server.reconciler.wait_idle(10)
    with srv.client() as c:
        cluster = c.get(f"/v1/clusters/{pod['id']}").json()["data"]
        assert cluster["registry_auth_id"] == int(saved["id"]) and cluster["status"] == "running"
    assert (image, RegistryCredentials("bot2", "second-token")) in fake_runtime.pull_credentials

    # Another account's key: the same not-found as an id of nothing.
    monkeypatch.setattr(runpod, "api_key", _other_key(srv))
    for call in (
        lambda: sdk.update_container_registry_auth(saved["id"], "x", "y"),
        lambda: sdk.delete_container_registry_auth(saved["id"]),
    ):
        with pytest.raises(sdk.error.QueryError, match="not found"):
            call()
    with pytest.raises(sdk.error.QueryError, match="containerRegistryAuthId"):
        sdk.create_template("theirs", image, registry_auth_id=saved["id"])
    monkeypatch.setattr(runpod, "api_key", srv.key)

    # In use by the template and the pod: refused, naming them; then deleted.
    with pytest.raises(sdk.error.QueryError, match=template["id"]):
        sdk.delete_container_registry_auth(saved["id"])
    sdk.terminate_pod(pod["id"])
    assert srv.server.reconciler.wait_idle(10)
    gone = srv.graphql('mutation { deleteTemplate(templateName: "private-template") }')
    assert "errors" not in gone, gone
    assert sdk.delete_container_registry_auth(saved["id"]) is True
    with srv.client() as c:
        assert c.get("/v1/registry-auths").json()["data"]["registry_auths"] == []
