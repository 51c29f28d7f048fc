"""Placement by CUDA driver version, over real HTTP on SQLite: hosts carry their
version (the operator declares it where NVML cannot tell, ``PATCH /v1/hosts/{id}``),
clusters ask for ``min_cuda_version`` (REST) / ``minCudaVersion`` and
``allowedCudaVersions`` (GraphQL), and only hosts that meet it are chosen, at create
and when a stopped cluster starts on another host. A host of unknown version (the
local machine here: its GPUs are declared) meets no minimum."""

from __future__ import annotations

from typing import Any

import httpx
from click.testing import CliRunner

from gpuyard.cli.main import cli
from gpuyard.core.tls_trust import trusted_tls
from tests.api.test_graphql import codes, gql
from tests.helpers import LiveServer, account_with_members, add_host_row, created, v1_error

A6000 = "NVIDIA RTX A6000"


def declare_cuda(srv: LiveServer, host_id: int, version: str | None) -> dict[str, Any]:
    with srv.client() as c:
        r = c.patch(f"/v1/hosts/{host_id}", json={"cuda_version": version})
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()["data"]
    return data


def fleet(srv: LiveServer) -> tuple[int, int]:
    """Two hosts with two A6000s each: CUDA 12.2 and 12.6 (ids in that order)."""
    old = add_host_row(srv.server.ctx, "cuda122", 2)
    new = add_host_row(srv.server.ctx, "cuda126", 2)
    declare_cuda(srv, old, "12.2")
    declare_cuda(srv, new, "12.6")
    return old, new


def body(**extra: Any) -> dict[str, Any]:
    return {"gpu_type": A6000, "gpu_count": 1, "docker_image": "x", "cpu_cores": 1, **extra}


def test_min_cuda_version_places_on_a_host_that_meets_it(srv: LiveServer) -> None:
    old, new = fleet(srv)
    with srv.client() as c:
        hosts = {h["id"]: h for h in c.get("/v1/hosts").json()["data"]["hosts"]}
        assert hosts[old]["cuda_version"] == "12.2"
        assert hosts[new]["cuda_version"] == "12.6"
        assert "cuda_version" in hosts[new]["declared"]
        # The local machine's GPUs are declared and no version was given: unknown.
        local = next(h for h in hosts.values() if h["is_local"])
        assert local["cuda_version"] is None
        for _ in range(2):
            cid = created(srv, c, body(min_cuda_version="12.4"))
            cluster = c.get(f"/v1/clusters/{cid}").json()["data"]
            assert cluster["host"]["id"] == new
            assert cluster["min_cuda_version"] == "12.4"
        # 12.6's two GPUs are taken; 12.2 and the local machine (unknown) do not qualify.
        r = c.post("/v1/clusters", json=body(min_cuda_version="12.4"))
        err = v1_error(r, 409, "INSUFFICIENT_CAPACITY")
        assert "min_cuda_version" in err["message"]
        # Without a minimum, any host with a free GPU.
        cid = created(srv, c, body())
        assert c.get(f"/v1/clusters/{cid}").json()["data"]["host"]["id"] != new


def test_a_minimum_no_host_meets_is_a_clear_refusal(srv: LiveServer) -> None:
    fleet(srv)
    with srv.client() as c:
        for minimum in ("13.0", "12.10"):  # 12.10 is above 12.6
            r = c.post("/v1/clusters", json=body(min_cuda_version=minimum))
            err = v1_error(r, 409, "INSUFFICIENT_CAPACITY")
            assert f"CUDA driver version at least {minimum} (min_cuda_version)" in err["message"]
            assert err["details"]["requested"]["min_cuda_version"] == minimum
            assert "cuda_version" in err["details"]["hint"]
            shown = {a["cuda_version"] for a in err["details"]["available"]}
            assert {"12.2", "12.6"} <= shown
        assert c.get("/v1/clusters").json()["data"]["clusters"] == []
        # Not a version: the body's own validation error.
        for bad in ("12.x", "twelve", "12.4.1", ""):
            r = c.post("/v1/clusters", json=body(min_cuda_version=bad))
            assert v1_error(r, 400, "VALIDATION_ERROR")["details"]["field"] == "min_cuda_version"


def test_allowed_cuda_versions_pick_one_of_them(srv: LiveServer) -> None:
    old, _ = fleet(srv)
    with srv.client() as c:
        cid = created(srv, c, body(allowed_cuda_versions=["12.2", "11.8"]))
        cluster = c.get(f"/v1/clusters/{cid}").json()["data"]
        assert cluster["host"]["id"] == old
        assert cluster["allowed_cuda_versions"] == ["12.2", "11.8"]
        r = c.post("/v1/clusters", json=body(allowed_cuda_versions=["11.8"]))
        assert "allowed_cuda_versions" in v1_error(r, 409, "INSUFFICIENT_CAPACITY")["message"]


GQL = (
    'mutation { podFindAndDeployOnDemand(input: {gpuTypeId: "NVIDIA RTX A6000", '
    'imageName: "x", gpuCount: 1, minVcpuCount: 1, CUDA}) '
    "{ id minCudaVersion machine { id } } }"
)


def test_graphql_min_cuda_version_and_allowed_versions(srv: LiveServer) -> None:
    old, new = fleet(srv)
    pod = gql(srv, GQL.replace("CUDA", 'minCudaVersion: "12.4"'))["data"]
    pod = pod["podFindAndDeployOnDemand"]
    assert pod["machine"]["id"] == str(new)
    assert pod["minCudaVersion"] == "12.4"
    refused = gql(srv, GQL.replace("CUDA", 'minCudaVersion: "13.0"'))
    assert codes(refused) == ["INSUFFICIENT_CAPACITY"]
    assert "min_cuda_version" in refused["errors"][0]["message"]
    pod = gql(srv, GQL.replace("CUDA", 'allowedCudaVersions: ["12.2"]'))["data"]
    assert pod["podFindAndDeployOnDemand"]["machine"]["id"] == str(old)
    # "" and [] as absent, as some clients send them.
    pod = gql(srv, GQL.replace("CUDA", 'minCudaVersion: "", allowedCudaVersions: []'))
    assert "errors" not in pod, pod
    bad = gql(srv, GQL.replace("CUDA", 'minCudaVersion: "12.x"'))
    assert codes(bad) == ["VALIDATION_ERROR"]
    assert bad["errors"][0]["extensions"]["details"]["field"] == "input.minCudaVersion"


def test_a_start_on_another_host_keeps_honouring_the_minimum(srv: LiveServer) -> None:
    old, new = fleet(srv)
    with srv.client() as c:
        cid = created(srv, c, body(min_cuda_version="12.4"))
        assert c.get(f"/v1/clusters/{cid}").json()["data"]["host"]["id"] == new
        assert c.post(f"/v1/clusters/{cid}/stop").status_code == 200
        assert srv.server.reconciler.wait_idle(10)
        assert c.post(f"/v1/hosts/{new}/cordon").status_code == 200
        # Its host takes nothing new; 12.2 and the local machine do not qualify.
        r = c.post(f"/v1/clusters/{cid}/start", json={})
        err = v1_error(r, 409, "INSUFFICIENT_CAPACITY")
        assert err["details"]["elsewhere"]["requested"]["min_cuda_version"] == "12.4"
        newer = add_host_row(srv.server.ctx, "cuda128", 2)
        declare_cuda(srv, newer, "12.8")
        r = c.post(f"/v1/clusters/{cid}/start", json={})
        assert r.status_code == 200, r.text
        assert srv.server.reconciler.wait_idle(10)
        cluster = c.get(f"/v1/clusters/{cid}").json()["data"]
        assert cluster["host"]["id"] == newer
        assert cluster["status"] == "running"
        assert old != newer


def test_the_host_version_is_the_operators_alone(srv: LiveServer) -> None:
    _, new = fleet(srv)
    _, _, keys = account_with_members(srv, "other@b.test", ())
    with httpx.Client(
        base_url=srv.url,
        headers={"Authorization": f"Bearer {keys['owner']}"},
        timeout=30,
        verify=trusted_tls(),
    ) as other:
        r = other.patch(f"/v1/hosts/{new}", json={"cuda_version": "99.0"})
        assert r.status_code in (403, 404), r.text
        assert other.get(f"/v1/hosts/{new}").status_code in (403, 404)
    with srv.client() as c:
        assert c.get(f"/v1/hosts/{new}").json()["data"]["cuda_version"] == "12.6"
        # Bad versions and unknown fields are refused in the envelope.
        for bad in ({"cuda_version": "12.x"}, {"cuda_version": 12.4}, {"cuda": "12.4"}):
            r = c.patch(f"/v1/hosts/{new}", json=bad)
            v1_error(r, 400, "VALIDATION_ERROR")
        assert v1_error(c.patch("/v1/hosts/999999", json={"cuda_version": "12.4"}), 404)
        # null: back to what is discovered (unknown for a declared host).
        view = declare_cuda(srv, new, None)
        assert view["cuda_version"] is None and "cuda_version" not in view["declared"]


def test_the_cli_declares_a_version_and_asks_for_a_minimum(srv: LiveServer) -> None:
    _, new = fleet(srv)
    env = {
        "GPUYARD_URL": srv.url,
        "GPUYARD_API_KEY": srv.key,
        "GPUYARD_HOME": str(srv.server.ctx.settings.home),
    }
    done = CliRunner().invoke(cli, ["hosts", "set-cuda", str(new), "12.8"], env=env)
    assert done.exit_code == 0, done.output
    assert f"host {new}: CUDA driver version 12.8" in done.output
    done = CliRunner().invoke(cli, ["hosts", "get", str(new)], env=env)
    assert "12.8" in done.output
    args = ["clusters", "create", "--image", "x", "--gpu-type", A6000, "--min-cuda-version",
            "12.7", "--entrypoint", '["/bin/sh", "-c"]', "--args", "sleep 9", "--json"]  # fmt: skip
    done = CliRunner().invoke(cli, args, env=env)
    assert done.exit_code == 0, done.output
    with srv.client() as c:
        cluster = c.get("/v1/clusters").json()["data"]["clusters"][0]
    assert cluster["host"]["id"] == new
    assert cluster["docker_entrypoint"] == ["/bin/sh", "-c"]
    bad = CliRunner().invoke(cli, [*args[:-5], "--entrypoint", "/bin/sh"], env=env)
    assert bad.exit_code != 0 and "JSON list" in bad.output


def test_a_host_whose_driver_fell_below_the_minimum_says_so(srv: LiveServer) -> None:
    old, new = fleet(srv)
    with srv.client() as c:
        cid = created(srv, c, body(min_cuda_version="12.4"))
        assert c.post(f"/v1/clusters/{cid}/stop").status_code == 200
        assert srv.server.reconciler.wait_idle(10)
        declare_cuda(srv, new, "12.3")  # an older driver installed meanwhile
        r = c.post(f"/v1/clusters/{cid}/start", json={"allow_move": False})
        err = v1_error(r, 409, "INSUFFICIENT_CAPACITY")
        assert "CUDA driver version at least 12.4 (min_cuda_version)" in err["message"]
        assert c.get(f"/v1/clusters/{cid}").json()["data"]["status"] == "stopped"
        declare_cuda(srv, old, "12.4")
        r = c.post(f"/v1/clusters/{cid}/start", json={})
        assert r.status_code == 200, r.text
        assert srv.server.reconciler.wait_idle(10)
        assert c.get(f"/v1/clusters/{cid}").json()["data"]["host"]["id"] == old
