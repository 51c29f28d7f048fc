"""RunPod's REST v2 resources other than pods, over real HTTP: templates, registries,
network volumes, the account's SSH keys and the catalog. Every answer is held to
RunPod's published document (tests/contract/runpod_v2.py), every refusal is a problem,
and another account's key sees none of this account's resources (404 by id, absent
from lists). Clusters: tests/api/test_runpod_v2_clusters.py."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpuyard.api.http.problems import RUNPOD_V2_PREFIX as V2
from gpuyard.core.tls_trust import trusted_tls
from tests.api.test_runpod_v2_problems import problem
from tests.contract.runpod_v2 import check_answer
from tests.helpers import LiveServer, account_with_members

A6000 = "NVIDIA RTX A6000"


def ok(r: httpx.Response, method: str, path: str, status: int = 200) -> Any:
    """The JSON of a ``status`` answer, checked against the document."""
    assert r.status_code == status, r.text
    body = r.json()
    check_answer(method, path, status, body)
    return body


def refused(r: httpx.Response, status: int, method: str, path: str) -> dict[str, Any]:
    """A problem of ``status``, itself valid as the document's error answer."""
    assert r.status_code == status, r.text
    body = r.json()
    check_answer(method, path, status, body)
    return problem(r, status, body["code"])


def other_key(srv: LiveServer, name: str = "other@b.test") -> str:
    return account_with_members(srv, name, ())[2]["owner"]


def public_key(tmp_path: Path, name: str) -> str:
    path = tmp_path / name
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(path)], check=True
    )
    return (tmp_path / f"{name}.pub").read_text().strip()


# ---------------------------------------------------------------- templates


def test_templates_crud_and_mapping(srv: LiveServer) -> None:
    body = {
        "name": "torch",
        "image": "docker.io/library/ubuntu:24.04",
        "args": "sleep infinity",
        "disk": 20,
        "env": {"A": "1"},
        "ports": ["8888/http", "22/tcp"],
        "mounts": {"persistent": {"size": 30, "path": "/workspace"}},
        "category": "NVIDIA",
        "startSsh": True,
        "startJupyter": True,
    }
    with srv.client() as c:
        t = ok(c.post(f"{V2}/templates", json=body), "POST", "/v2/templates", 201)
        assert t["name"] == "torch" and t["image"] == body["image"]
        assert t["ports"] == ["8888/http", "22/tcp"] and t["disk"] == 20
        assert t["mounts"] == {"persistent": {"size": 30, "path": "/workspace"}}
        assert t["env"] == {"A": "1"} and t["public"] is False and t["registry"] is None
        # The same row on /v1.
        v1 = c.get(f"/v1/templates/{t['id']}").json()["data"]
        assert v1["docker_image"] == body["image"] and v1["volume_gb"] == 30
        assert v1["ports"][0]["internal_port"] == 8888 and v1["ports"][0]["protocol"] == "http"

        got = ok(c.get(f"{V2}/templates/{t['id']}"), "GET", "/v2/templates/{id}")
        assert got == t
        listed = ok(c.get(f"{V2}/templates"), "GET", "/v2/templates")
        assert [x["id"] for x in listed["templates"]] == [t["id"]]

        patched = ok(
            c.patch(f"{V2}/templates/{t['id']}", json={"name": "torch2", "ports": ["7860/http"]}),
            "PATCH",
            "/v2/templates/{id}",
        )
        assert patched["name"] == "torch2" and patched["ports"] == ["7860/http"]
        assert patched["image"] == body["image"] and patched["disk"] == 20

        r = c.delete(f"{V2}/templates/{t['id']}")
        assert r.status_code == 204 and r.content == b""
        refused(c.get(f"{V2}/templates/{t['id']}"), 404, "GET", "/v2/templates/{id}")
        refused(c.delete(f"{V2}/templates/{t['id']}"), 404, "DELETE", "/v2/templates/{id}")


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"public": True}, "public"),
        ({"serverless": True}, "serverless"),
        ({"category": "AMD"}, "category"),
        ({"ports": ["http"]}, "ports"),
        ({"allowedCudaVersions": ["12.4"]}, "allowedCudaVersions"),
        ({"unknown": 1}, "unknown"),
        ({"disk": 0}, "disk"),
    ],
)
def test_template_bad_input_is_a_422_problem_naming_the_field(
    srv: LiveServer, extra: dict[str, Any], field: str
) -> None:
    with srv.client() as c:
        body = {"name": "t", "image": "img", **extra}
        p = refused(c.post(f"{V2}/templates", json=body), 422, "POST", "/v2/templates")
        assert any(e.startswith(field) for e in p["errors"]), p
        assert c.get(f"{V2}/templates").json()["templates"] == []


def test_template_problems_not_json_taken_name_and_registry_field(srv: LiveServer) -> None:
    with srv.client() as c:
        r = c.post(f"{V2}/templates", content=b"{", headers={"content-type": "application/json"})
        refused(r, 400, "POST", "/v2/templates")
        ok(
            c.post(f"{V2}/templates", json={"name": "t", "image": "img"}),
            "POST",
            "/v2/templates",
            201,
        )
        p = refused(
            c.post(f"{V2}/templates", json={"name": "t", "image": "img"}),
            409,
            "POST",
            "/v2/templates",
        )
        assert p["code"] == "TEMPLATE_EXISTS"
        # An image the registry policy refuses names v2's ``image``.
        p = refused(
            c.post(f"{V2}/templates", json={"name": "u", "image": "bad image!"}),
            400,
            "POST",
            "/v2/templates",
        )
        assert p["errors"] and p["errors"][0].startswith("image"), p


# ---------------------------------------------------------------- registries


def test_registries_crud_and_the_password_is_never_answered(srv: LiveServer) -> None:
    secret = "s3cr3t-Pa55word-nobody-sees"
    with srv.client() as c:
        body = {"name": "ghcr", "username": "robot", "password": secret}
        r = c.post(f"{V2}/registries", json=body)
        reg = ok(r, "POST", "/v2/registries", 201)
        assert set(reg) == {"id", "name"} and isinstance(reg["id"], str)
        answers = [r.text]
        r = c.get(f"{V2}/registries/{reg['id']}")
        assert ok(r, "GET", "/v2/registries/{id}") == reg
        answers.append(r.text)
        r = c.get(f"{V2}/registries")
        assert ok(r, "GET", "/v2/registries")["registries"] == [reg]
        answers.append(r.text)
        answers.append(c.get("/v1/registry-auths").text)
        assert all(secret not in a and "robot" not in a for a in answers)
        # A template names it as ``registry``.
        t = ok(
            c.post(f"{V2}/templates", json={"name": "p", "image": "img", "registry": reg["id"]}),
            "POST",
            "/v2/templates",
            201,
        )
        assert t["registry"] == reg["id"]
        p = refused(c.post(f"{V2}/registries", json=body), 409, "POST", "/v2/registries")
        assert secret not in str(p)
        p = refused(
            c.post(f"{V2}/registries", json={"name": "x", "username": "u"}),
            422,
            "POST",
            "/v2/registries",
        )
        assert any(e.startswith("password") for e in p["errors"])
        # Kept while the template names it; deleted once nothing does.
        p = refused(c.delete(f"{V2}/registries/{reg['id']}"), 409, "DELETE", "/v2/registries/{id}")
        assert p["code"] == "REGISTRY_AUTH_IN_USE" and t["id"] in p["detail"]
        assert c.delete(f"{V2}/templates/{t['id']}").status_code == 204
        assert c.delete(f"{V2}/registries/{reg['id']}").status_code == 204
        for bad in (reg["id"], "abc", "0", "99999999999999999999999"):
            refused(c.get(f"{V2}/registries/{bad}"), 404, "GET", "/v2/registries/{id}")
        refused(c.delete(f"{V2}/registries/{reg['id']}"), 404, "DELETE", "/v2/registries/{id}")
        # ECR delegations are not served.
        problem(c.get(f"{V2}/registries/delegations"), 404, "REGISTRY_AUTH_NOT_FOUND")


# ---------------------------------------------------------------- network volumes


def test_network_volumes_crud(srv: LiveServer) -> None:
    with srv.client() as c:
        body = {"name": "data", "size": 10, "dataCenter": "local"}
        nv = ok(c.post(f"{V2}/network-volumes", json=body), "POST", "/v2/network-volumes", 201)
        assert nv["size"] == 10 and nv["dataCenter"] == "local" and nv["type"] == "STANDARD"
        assert (
            ok(c.get(f"{V2}/network-volumes/{nv['id']}"), "GET", "/v2/network-volumes/{id}") == nv
        )
        listed = ok(c.get(f"{V2}/network-volumes"), "GET", "/v2/network-volumes")
        assert listed["networkVolumes"] == [nv]
        grown = ok(
            c.patch(f"{V2}/network-volumes/{nv['id']}", json={"size": 20, "name": "data2"}),
            "PATCH",
            "/v2/network-volumes/{id}",
        )
        assert grown["size"] == 20 and grown["name"] == "data2"
        p = refused(
            c.patch(f"{V2}/network-volumes/{nv['id']}", json={"size": 10}),
            400,
            "PATCH",
            "/v2/network-volumes/{id}",
        )
        assert p["errors"] == ["size"]
        p = refused(
            c.post(f"{V2}/network-volumes", json={**body, "dataCenter": "mars"}),
            400,
            "POST",
            "/v2/network-volumes",
        )
        assert p["errors"] == ["dataCenter"]
        for bad in ({**body, "size": 5}, {**body, "type": "HIGH_PERFORMANCE"}, {"name": "x"}):
            refused(c.post(f"{V2}/network-volumes", json=bad), 422, "POST", "/v2/network-volumes")
        assert c.delete(f"{V2}/network-volumes/{nv['id']}").status_code == 204
        refused(c.get(f"{V2}/network-volumes/{nv['id']}"), 404, "GET", "/v2/network-volumes/{id}")


# ---------------------------------------------------------------- SSH keys


def test_ssh_keys_put_replaces_all_or_nothing(srv: LiveServer, tmp_path: Path) -> None:
    k1, k2 = public_key(tmp_path, "one"), public_key(tmp_path, "two")
    with srv.client() as c:
        assert ok(c.get(f"{V2}/account/ssh-keys"), "GET", "/v2/account/ssh-keys") == {"keys": []}
        put = ok(
            c.put(f"{V2}/account/ssh-keys", json={"keys": [k1, k2]}), "PUT", "/v2/account/ssh-keys"
        )
        assert put == {"keys": [k1, k2]}
        assert ok(c.get(f"{V2}/account/ssh-keys"), "GET", "/v2/account/ssh-keys") == put
        assert len(c.get("/v1/ssh-keys").json()["data"]["ssh_keys"]) == 2
        # A bad key anywhere changes nothing, and the problem names it.
        p = refused(
            c.put(f"{V2}/account/ssh-keys", json={"keys": [k1, "ssh-ed25519 AAAAnot-a-key"]}),
            422,
            "PUT",
            "/v2/account/ssh-keys",
        )
        assert p["errors"][0].startswith("keys[1]"), p
        assert c.get(f"{V2}/account/ssh-keys").json() == {"keys": [k1, k2]}
        p = refused(c.put(f"{V2}/account/ssh-keys", json={}), 422, "PUT", "/v2/account/ssh-keys")
        assert p["errors"][0].startswith("keys")
        put = ok(
            c.put(f"{V2}/account/ssh-keys", json={"keys": [k2]}), "PUT", "/v2/account/ssh-keys"
        )
        assert put == {"keys": [k2]}
        assert ok(
            c.put(f"{V2}/account/ssh-keys", json={"keys": []}), "PUT", "/v2/account/ssh-keys"
        ) == {"keys": []}


# ---------------------------------------------------------------- catalog


def test_catalog_gpus_and_datacenters(srv: LiveServer) -> None:
    with srv.client() as c:
        gpus = ok(c.get(f"{V2}/catalog/gpus"), "GET", "/v2/catalog/gpus")["gpus"]
        a6000 = next(g for g in gpus if g["id"] == A6000)
        assert a6000["secure"] is True and a6000["maxCount"]["secure"] == 4
        assert "availability" not in a6000
        params = {"include": "AVAILABILITY", "product": "POD", "count": "4"}
        avail = ok(c.get(f"{V2}/catalog/gpus", params=params), "GET", "/v2/catalog/gpus")["gpus"]
        a6000 = next(g for g in avail if g["id"] == A6000)
        assert a6000["availability"] == "LOW"
        assert a6000["dataCenters"] == [{"id": "local", "name": "local", "availability": "LOW"}]
        five = {**params, "count": "5"}
        one = ok(c.get(f"{V2}/catalog/gpus/{A6000}", params=five), "GET", "/v2/catalog/gpus/{id}")
        assert one["availability"] == "NONE"
        refused(c.get(f"{V2}/catalog/gpus/no-such-gpu"), 404, "GET", "/v2/catalog/gpus/{id}")
        # Filters only with include=AVAILABILITY (400); malformed values 422.
        refused(c.get(f"{V2}/catalog/gpus", params={"count": "2"}), 400, "GET", "/v2/catalog/gpus")
        refused(
            c.get(f"{V2}/catalog/gpus", params={"include": "AVAILABILITY"}),
            400,
            "GET",
            "/v2/catalog/gpus",
        )
        bad = {**params, "cudaVersions": "12"}
        refused(c.get(f"{V2}/catalog/gpus", params=bad), 422, "GET", "/v2/catalog/gpus")

        dcs = ok(c.get(f"{V2}/catalog/datacenters"), "GET", "/v2/catalog/datacenters")
        assert [d["id"] for d in dcs["dataCenters"]] == ["local"]
        dc = ok(
            c.get(f"{V2}/catalog/datacenters/local", params={"include": "GPU_AVAILABILITY"}),
            "GET",
            "/v2/catalog/datacenters/{id}",
        )
        assert {g["id"] for g in dc["gpuAvailability"]} >= {A6000}
        filtered = c.get(f"{V2}/catalog/datacenters", params={"compliance": "GDPR"}).json()
        assert filtered == {"dataCenters": []}
        refused(
            c.get(f"{V2}/catalog/datacenters", params={"regions": "MOON"}),
            422,
            "GET",
            "/v2/catalog/datacenters",
        )
        refused(c.get(f"{V2}/catalog/datacenters/mars"), 404, "GET", "/v2/catalog/datacenters/{id}")
    # No key: 401, as a problem.
    refused(
        httpx.get(f"{srv.url}{V2}/catalog/gpus", verify=trusted_tls()),
        401,
        "GET",
        "/v2/catalog/gpus",
    )


# ---------------------------------------------------------------- tenancy


def test_another_account_sees_none_of_these_resources(srv: LiveServer, tmp_path: Path) -> None:
    with srv.client() as c:
        t = c.post(f"{V2}/templates", json={"name": "mine", "image": "img"}).json()
        reg = c.post(
            f"{V2}/registries", json={"name": "mine", "username": "u", "password": "p"}
        ).json()
        nv = c.post(
            f"{V2}/network-volumes", json={"name": "mine", "size": 10, "dataCenter": "local"}
        ).json()
        mine = public_key(tmp_path, "mine")
        c.put(f"{V2}/account/ssh-keys", json={"keys": [mine]})
    theirs = other_key(srv)
    with srv.client(theirs) as c:
        for kind, rid in (
            ("templates", t["id"]),
            ("registries", reg["id"]),
            ("network-volumes", nv["id"]),
        ):
            path = f"/v2/{kind}/{{id}}"
            refused(c.get(f"{V2}/{kind}/{rid}"), 404, "GET", path)
            refused(c.delete(f"{V2}/{kind}/{rid}"), 404, "DELETE", path)
        refused(
            c.patch(f"{V2}/templates/{t['id']}", json={"name": "taken"}),
            404,
            "PATCH",
            "/v2/templates/{id}",
        )
        refused(
            c.patch(f"{V2}/network-volumes/{nv['id']}", json={"size": 20}),
            404,
            "PATCH",
            "/v2/network-volumes/{id}",
        )
        assert c.get(f"{V2}/templates").json() == {"templates": []}
        assert c.get(f"{V2}/registries").json() == {"registries": []}
        assert c.get(f"{V2}/network-volumes").json() == {"networkVolumes": []}
        assert c.get(f"{V2}/account/ssh-keys").json() == {"keys": []}
        # Their replace leaves this account's keys alone.
        assert c.put(f"{V2}/account/ssh-keys", json={"keys": []}).status_code == 200
    with srv.client() as c:
        assert c.get(f"{V2}/account/ssh-keys").json() == {"keys": [mine]}
        assert c.get(f"{V2}/templates/{t['id']}").status_code == 200
