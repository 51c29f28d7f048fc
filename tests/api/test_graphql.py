"""GraphQL (seed 001): every curl body verbatim over real HTTP, RunPod's names, error
codes, 401, limits and account isolation."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from gpuyard.core.tls_trust import trusted_tls
from gpuyard.services.tenancy.auth import Scope, create_account, issue_key
from tests.helpers import LiveServer

# The seed's --data bodies, byte for byte (ids are replaced where a test needs a real one).
SEED_DEPLOY = r"""{"query": "mutation { clusterFindAndDeployOnDemand( input: { cloudType: ALL, gpuCount: 1, volumeInGb: 40, containerDiskInGb: 40, minVcpuCount: 2, minMemoryInGb: 15, gpuTypeId: \"NVIDIA RTX A6000\", name: \"Tensor One Tensorflow\", imageName: \"tensorone/tensorflow\", dockerArgs: \"\", ports: \"8888/http\", volumeMountPath: \"/workspace\", env: [{ key: \"JUPYTER_PASSWORD\", value: \"rn51hunbpgtltcpac3ol\" }] } ) { id imageName env machineId machine { clusterHostId } } }"}"""  # noqa: E501
SEED_SPOT = r"""{"query": "mutation { clusterRentInterruptable( input: { bidPerGpu: 0.2, cloudType: SECURE, gpuCount: 1, volumeInGb: 40, containerDiskInGb: 40, minVcpuCount: 2, minMemoryInGb: 15, gpuTypeId: \"NVIDIA RTX A6000\", name: \"Tensor One Pytorch\", imageName: \"tensorone/pytorch\", dockerArgs: \"\", ports: \"8888/http\", volumeMountPath: \"/workspace\", env: [{ key: \"JUPYTER_PASSWORD\", value: \"vunw9ybnzqwpia2795p2\" }] } ) { id imageName env machineId machine { clusterHostId } } }"}"""  # noqa: E501
SEED_RESUME = r"""{"query": "mutation { clusterResume( input: { clusterId: \"inzk6tzuz833h5\", gpuCount: 1 } ) { id desiredStatus imageName env machineId machine { clusterHostId } } }"}"""  # noqa: E501
SEED_BID_RESUME = r"""{"query": "mutation { clusterBidResume( input: { clusterId: \"d62t7qg9n5vtan\", bidPerGpu: 0.2, gpuCount: 1 } ) { id desiredStatus imageName env machineId machine { clusterHostId } } }"}"""  # noqa: E501
SEED_STOP = r"""{"query": "mutation { clusterStop(input: {clusterId: \"riixlu8oclhp\"}) { id desiredStatus } }"}"""  # noqa: E501
SEED_LIST = r"""{"query": "query clusters { myself { clusters { id name runtime { uptimeInSeconds ports { ip isIpPublic privatePort publicPort type } gpus { id gpuUtilPercent memoryUtilPercent } container { cpuPercent memoryPercent } } } } }"}"""  # noqa: E501
SEED_GET = r"""{"query": "query cluster { cluster(input: {clusterId: \"ldl1dxirsim64n\"}) { id name runtime { uptimeInSeconds ports { ip isIpPublic privatePort publicPort type } gpus { id gpuUtilPercent memoryUtilPercent } container { cpuPercent memoryPercent } } } }"}"""  # noqa: E501
SEED_GPU_TYPES = r"""{"query": "query GpuTypes { gpuTypes { id displayName memoryInGb } }"}"""
SEED_GPU_TYPE = r"""{"query": "query GpuTypes { gpuTypes(input: {id: \"NVIDIA GeForce RTX 3090\"}) { id displayName memoryInGb secureCloud communityCloud lowestPrice(input: {gpuCount: 1}) { minimumBidPrice uninterruptablePrice } } }"}"""  # noqa: E501


POD_DEPLOY = (
    'mutation { podFindAndDeployOnDemand(input: {gpuTypeId: "NVIDIA RTX A6000", '
    'imageName: "x", EXTRA}) { id } }'
)


def post_raw(srv: LiveServer, body: str, key: str | None = None) -> httpx.Response:
    """Like the seed's curl: the key in the URL, the body as given."""
    return httpx.post(
        f"{srv.url}/graphql?api_key={key or srv.key}",
        content=body,
        headers={"content-type": "application/json"},
        timeout=30,
        verify=trusted_tls(),
    )


def gql(
    srv: LiveServer, query: str, key: str | None = None, variables: dict[str, Any] | None = None
) -> dict[str, Any]:
    return srv.graphql(query, variables, key)


def data_of(r: httpx.Response) -> dict[str, Any]:
    assert r.status_code == 200, r.text
    body = r.json()
    assert "errors" not in body, body
    out: dict[str, Any] = body["data"]
    return out


def codes(body: dict[str, Any]) -> list[str]:
    return [e["extensions"]["code"] for e in body.get("errors", [])]


def deploy(srv: LiveServer, key: str | None = None) -> str:
    cid: str = data_of(post_raw(srv, SEED_DEPLOY, key))["clusterFindAndDeployOnDemand"]["id"]
    assert srv.server.reconciler.wait_idle(10)
    return cid


def test_seed_deploy_list_get_stop_resume_terminate(srv: LiveServer) -> None:
    created = data_of(post_raw(srv, SEED_DEPLOY))["clusterFindAndDeployOnDemand"]
    assert created["imageName"] == "tensorone/tensorflow"
    # A password is shown masked (it is stored encrypted; the container gets it).
    assert created["env"] == ["JUPYTER_PASSWORD=********"]
    assert created["machineId"] and created["machine"]["clusterHostId"]
    cid = created["id"]
    assert srv.server.reconciler.wait_idle(10)
    with srv.client() as c:
        rest = c.get(f"/v1/clusters/{cid}").json()["data"]
    assert rest["volume_gb"] == 40 and rest["container_disk_gb"] == 40
    assert rest["cpu_cores"] == 2 and rest["memory_gb"] == 15 and rest["gpu_count"] == 1
    assert rest["ports"][0]["internal_port"] == 8888 and rest["ports"][0]["protocol"] == "http"
    assert rest["volume_mount_path"] == "/workspace" and rest["cloud_type"] == "ALL"

    listed = data_of(post_raw(srv, SEED_LIST))["myself"]["clusters"]
    assert [x["id"] for x in listed] == [cid]
    runtime = listed[0]["runtime"]
    assert runtime["uptimeInSeconds"] >= 0
    port = runtime["ports"][0]
    assert port["privatePort"] == 8888 and port["type"] == "http"
    assert port["publicPort"] == rest["ports"][0]["external_port"] and port["ip"]
    assert runtime["gpus"] == [
        {"id": runtime["gpus"][0]["id"], "gpuUtilPercent": 0.0, "memoryUtilPercent": 0.0}
    ]
    assert runtime["container"] == {"cpuPercent": 1.0, "memoryPercent": 2.0}  # FakeRuntime

    got = data_of(post_raw(srv, SEED_GET.replace("ldl1dxirsim64n", cid)))["cluster"]
    assert got["id"] == cid and got["runtime"] == runtime | {
        "uptimeInSeconds": got["runtime"]["uptimeInSeconds"]
    }

    stopped = data_of(post_raw(srv, SEED_STOP.replace("riixlu8oclhp", cid)))["clusterStop"]
    assert stopped == {"id": cid, "desiredStatus": "EXITED"}
    assert srv.server.reconciler.wait_idle(10)
    got = data_of(post_raw(srv, SEED_GET.replace("ldl1dxirsim64n", cid)))["cluster"]
    assert got["runtime"] is None

    resumed = data_of(post_raw(srv, SEED_RESUME.replace("inzk6tzuz833h5", cid)))["clusterResume"]
    assert resumed["desiredStatus"] == "RUNNING" and resumed["imageName"] == "tensorone/tensorflow"
    assert resumed["machine"]["clusterHostId"] == created["machine"]["clusterHostId"]
    assert srv.server.reconciler.wait_idle(10)

    body = gql(srv, f'mutation {{ clusterTerminate(input: {{clusterId: "{cid}"}}) }}')
    assert body == {"data": {"clusterTerminate": None}}
    assert srv.server.reconciler.wait_idle(10)
    status = gql(srv, f'{{ cluster(input: {{clusterId: "{cid}"}}) {{ status desiredStatus }} }}')
    assert status["data"]["cluster"] == {"status": "terminated", "desiredStatus": "TERMINATED"}
    assert data_of(post_raw(srv, SEED_LIST))["myself"]["clusters"] == []


def test_seed_bodies_with_unknown_ids_answer_not_found(srv: LiveServer) -> None:
    for body, field in (
        (SEED_RESUME, "clusterResume"),
        (SEED_STOP, "clusterStop"),
        (SEED_GET, "cluster"),
    ):
        r = post_raw(srv, body)
        assert r.status_code == 200
        out = r.json()
        assert out["data"] == {field: None}
        assert codes(out) == ["CLUSTER_NOT_FOUND"], out
        assert out["errors"][0]["path"] == [field]


def test_seed_gpu_types(srv: LiveServer) -> None:
    types = data_of(post_raw(srv, SEED_GPU_TYPES))["gpuTypes"]
    a6000 = next(t for t in types if t["id"] == "NVIDIA RTX A6000")
    assert a6000 == {"id": "NVIDIA RTX A6000", "displayName": "RTX A6000", "memoryInGb": 48}
    one = data_of(post_raw(srv, SEED_GPU_TYPE))["gpuTypes"]
    assert len(one) == 1 and one[0]["id"] == "NVIDIA GeForce RTX 3090"
    # No host has a 3090 (tests declare A6000 and 4090): no bid can win one.
    assert one[0]["secureCloud"] is False and one[0]["communityCloud"] is False
    assert one[0]["lowestPrice"] == {"minimumBidPrice": None, "uninterruptablePrice": 0.43}
    q = (
        '{ gpuTypes(input: {id: "NVIDIA RTX A6000"}) { maxGpuCount secureCloud securePrice '
        "secureSpotPrice communitySpotPrice oneWeekPrice cudaCores manufacturer "
        "lowestPrice(input: {gpuCount: 2}) { minimumBidPrice uninterruptablePrice stockStatus "
        "availableGpuCounts } } }"
    )
    a = gql(srv, q)["data"]["gpuTypes"][0]
    assert a["maxGpuCount"] == 4 and a["secureCloud"] is True and a["manufacturer"] == "Nvidia"
    price = a["lowestPrice"]
    assert price["uninterruptablePrice"] in (0.76, 0.33)
    assert price["minimumBidPrice"] is not None and price["stockStatus"] in ("High", "Medium")
    assert price["availableGpuCounts"][:2] == [1, 2]
    assert gql(srv, '{ gpuTypes(input: {id: "no such gpu"}) { id } }') == {"data": {"gpuTypes": []}}


def test_seed_spot_bodies(srv: LiveServer) -> None:
    # The seed bids 0.2 for an A6000: exactly the default catalog's secure spot floor.
    created = data_of(post_raw(srv, SEED_SPOT))["clusterRentInterruptable"]
    cid = created["id"]
    assert created["imageName"] == "tensorone/pytorch"
    # A password is shown masked (it is stored encrypted; the container gets it).
    assert created["env"] == ["JUPYTER_PASSWORD=********"]
    assert created["machine"]["clusterHostId"]
    assert srv.server.reconciler.wait_idle(10)
    q = f'{{ pod(input: {{podId: "{cid}"}}) {{ podType bidPerGpu costPerHr status }} }}'
    pod = gql(srv, q)["data"]["pod"]
    assert pod["podType"] == "INTERRUPTABLE" and pod["bidPerGpu"] == 0.2
    assert pod["status"] == "running" and pod["costPerHr"] < 0.76  # pays its bid

    data_of(post_raw(srv, SEED_STOP.replace("riixlu8oclhp", cid)))
    assert srv.server.reconciler.wait_idle(10)
    resumed = data_of(post_raw(srv, SEED_BID_RESUME.replace("d62t7qg9n5vtan", cid)))
    out = resumed["clusterBidResume"]
    assert out["id"] == cid and out["desiredStatus"] == "RUNNING"
    assert out["env"] == created["env"] and out["machine"] == created["machine"]
    assert srv.server.reconciler.wait_idle(10)
    assert gql(srv, q)["data"]["pod"]["podType"] == "INTERRUPTABLE"
    # Too low a bid on resume is refused the same way.
    data_of(post_raw(srv, SEED_STOP.replace("riixlu8oclhp", cid)))
    assert srv.server.reconciler.wait_idle(10)
    low = SEED_BID_RESUME.replace("d62t7qg9n5vtan", cid).replace(
        "bidPerGpu: 0.2", "bidPerGpu: 0.01"
    )
    body = post_raw(srv, low).json()
    assert codes(body) == ["VALIDATION_ERROR"]
    assert body["errors"][0]["extensions"]["details"]["field"] == "input.bidPerGpu"
    assert "floor" in body["errors"][0]["message"]


def test_on_demand_preempts_spot_through_graphql(srv: LiveServer) -> None:
    rent = SEED_SPOT.replace("gpuCount: 1", "gpuCount: 4")
    spot_id = data_of(post_raw(srv, rent))["clusterRentInterruptable"]["id"]
    assert srv.server.reconciler.wait_idle(10)
    price = gql(
        srv,
        '{ gpuTypes(input: {id: "NVIDIA RTX A6000"}) { lowestPrice(input: {gpuCount: 1, '
        "secureCloud: true}) { minimumBidPrice stockStatus availableGpuCounts } } }",
    )["data"]["gpuTypes"][0]["lowestPrice"]
    assert price["availableGpuCounts"] == [] and price["stockStatus"] is None
    assert price["minimumBidPrice"] is not None and price["minimumBidPrice"] > 0.2
    on_demand = data_of(post_raw(srv, SEED_DEPLOY))["clusterFindAndDeployOnDemand"]
    assert srv.server.reconciler.wait_idle(10)
    q = f'{{ pod(input: {{podId: "{spot_id}"}}) {{ status desiredStatus lastStatusChange }} }}'
    preempted = gql(srv, q)["data"]["pod"]
    assert preempted["status"] == "stopped" and preempted["desiredStatus"] == "EXITED"
    assert "preempted" in preempted["lastStatusChange"]
    assert on_demand["id"] in {
        c["id"] for c in gql(srv, "{ myself { pods { id } } }")["data"]["myself"]["pods"]
    }


def test_runpod_names_on_the_same_schema(srv: LiveServer) -> None:
    q = (
        "mutation { podFindAndDeployOnDemand(input: { cloudType: ALL, gpuCount: 1, "
        'gpuTypeIdList: ["NVIDIA H100 80GB HBM3", "NVIDIA GeForce RTX 4090"], '
        'name: "rp", imageName: "img", ports: "8888/http,22/tcp", minVcpuCount: 3, '
        "minMemoryInGb: 6, volumeInGb: 5, startSsh: true, supportPublicIp: true, "
        'dataCenterId: null, templateId: "runpod-torch", countryCode: "RO", '
        'allowedCudaVersions: ["12.1"], minDownload: 100, env: [{key: "A", value: "1"}] }) '
        "{ id podType gpuCount vcpuCount memoryInGb ports port env machine { podHostId "
        "gpuDisplayName gpuTypeId gpuAvailable location maintenanceStart maintenanceEnd "
        "maintenanceNote gpuSource } } }"
    )
    # allowedCudaVersions is honoured: the machine's GPUs are declared, so is its version.
    with srv.client() as c:
        local = next(h for h in c.get("/v1/hosts").json()["data"]["hosts"] if h["is_local"])
        assert c.patch(f"/v1/hosts/{local['id']}", json={"cuda_version": "12.1"}).is_success
    pod = gql(srv, q)["data"]["podFindAndDeployOnDemand"]
    assert pod["podType"] == "RESERVED" and pod["gpuCount"] == 1
    assert pod["vcpuCount"] == 3 and pod["memoryInGb"] == 6
    assert pod["ports"] == "8888/http,22/tcp" and pod["port"] == 8888 and pod["env"] == ["A=1"]
    m = pod["machine"]
    # No H100 anywhere: the list's next type with capacity was used.
    assert m["gpuTypeId"] == "NVIDIA GeForce RTX 4090" and m["gpuDisplayName"] == "RTX 4090"
    assert m["gpuAvailable"] == 3 and m["gpuSource"] == "declared"
    assert m["podHostId"].startswith(pod["id"]) and m["maintenanceStart"] is None
    pid = pod["id"]
    assert srv.server.reconciler.wait_idle(10)

    fields = (
        "id name imageName dockerArgs dockerId env gpuCount vcpuCount memoryInGb "
        "containerDiskInGb volumeInGb volumeMountPath costPerHr desiredStatus "
        "lastStatusChange machineId podType port ports uptimeSeconds status actions "
        "runtime { uptimeInSeconds ports { ip isIpPublic privatePort publicPort type } "
        "gpus { id gpuUtilPercent memoryUtilPercent } container { cpuPercent memoryPercent } } "
        "machine { podHostId gpuDisplayName }"
    )
    mine = gql(
        srv,
        f"{{ myself {{ id pubKey currentSpendPerHr networkVolumes {{ id }} "
        f"pods {{ {fields} }} clusters {{ id }} }} }}",
    )
    me = mine["data"]["myself"]
    assert me["networkVolumes"] == [] and me["clusters"] == [{"id": pid}]
    p = me["pods"][0]
    assert p["status"] == "running" and p["desiredStatus"] == "RUNNING"
    assert p["actions"] == ["stop", "restart", "terminate"] and p["dockerId"]
    assert p["costPerHr"] == pytest.approx(me["currentSpendPerHr"]) and p["costPerHr"] > 0.69
    assert len(p["runtime"]["ports"]) == 2 and p["volumeMountPath"] == "/workspace"
    one = gql(srv, f'{{ pod(input: {{podId: "{pid}"}}) {{ {fields} }} }}')["data"]["pod"]
    assert one["id"] == pid and one["machine"] == p["machine"]

    stopped = gql(
        srv, f'mutation {{ podStop(input: {{podId: "{pid}"}}) {{ id desiredStatus status }} }}'
    )
    # The answer is read after the intent commits; the reconciler (woken by that
    # commit) may already have finished the stop, so either status is right here.
    answer = stopped["data"]["podStop"]
    assert answer["status"] in {"stopping", "stopped"}
    assert answer == {"id": pid, "desiredStatus": "EXITED", "status": answer["status"]}
    assert srv.server.reconciler.wait_idle(10)
    after = gql(srv, f'{{ pod(input: {{podId: "{pid}"}}) {{ status }} }}')["data"]["pod"]
    assert after == {"status": "stopped"}
    resumed = gql(
        srv,
        f'mutation {{ podResume(input: {{podId: "{pid}", gpuCount: 2}}) '
        "{ id gpuCount desiredStatus } }",
    )
    assert resumed["data"]["podResume"] == {"id": pid, "gpuCount": 2, "desiredStatus": "RUNNING"}
    assert srv.server.reconciler.wait_idle(10)
    assert gql(srv, f'mutation {{ podTerminate(input: {{podId: "{pid}"}}) }}') == {
        "data": {"podTerminate": None}
    }

    cpu = gql(
        srv,
        'mutation { deployCpuPod(input: { name: "c", imageName: "img", instanceId: "cpu3c-4-8", '
        'cloudType: ALL, templateId: "runpod-ubuntu" }) '
        "{ id gpuCount vcpuCount memoryInGb machine { gpuTypeId } } }",
    )["data"]["deployCpuPod"]
    assert cpu["gpuCount"] == 0 and cpu["vcpuCount"] == 4 and cpu["memoryInGb"] == 8


def test_error_codes(srv: LiveServer) -> None:
    cid = deploy(srv)
    # Resume a running cluster: INVALID_STATE with the REST details.
    body = gql(srv, f'mutation {{ clusterResume(input: {{clusterId: "{cid}"}}) {{ id }} }}')
    assert codes(body) == ["INVALID_STATE"]
    details = body["errors"][0]["extensions"]["details"]
    assert details["current_status"] == "running" and "start" not in details["allowed_actions"]
    # More GPUs than any host has: INSUFFICIENT_CAPACITY, nothing created.
    big = SEED_DEPLOY.replace("gpuCount: 1", "gpuCount: 64")
    assert codes(post_raw(srv, big).json()) == ["INSUFFICIENT_CAPACITY"]
    # Use-case validation names the GraphQL field.
    body = gql(
        srv,
        POD_DEPLOY.replace("EXTRA", 'ports: "abc"'),
    )
    assert codes(body) == ["VALIDATION_ERROR"]
    assert body["errors"][0]["extensions"]["details"]["field"] == "input.ports"
    body = gql(
        srv,
        POD_DEPLOY.replace("EXTRA", 'volumeMountPath: "relative"'),
    )
    assert body["errors"][0]["extensions"]["details"]["field"] == "input.volumeMountPath"
    body = gql(
        srv, 'mutation { podFindAndDeployOnDemand(input: {gpuTypeId: "NVIDIA RTX A6000"}) { id } }'
    )
    assert body["errors"][0]["extensions"]["details"]["field"] == "input.imageName"
    body = gql(
        srv,
        'mutation { podFindAndDeployOnDemand(input: {gpuTypeId: "nope", imageName: "x"}) { id } }',
    )
    assert codes(body) == ["VALIDATION_ERROR"]
    body = gql(
        srv,
        POD_DEPLOY.replace("EXTRA", 'networkVolumeId: "nv1"'),
    )
    assert codes(body) == ["NETWORK_VOLUME_NOT_FOUND"]
    # GraphQL's own errors: syntax, unknown field, wrong argument type.
    assert codes(gql(srv, "{ myself { ")) == ["VALIDATION_ERROR"]
    assert codes(gql(srv, "{ myself { nope } }")) == ["VALIDATION_ERROR"]
    assert codes(gql(srv, "{ gpuTypes(input: {id: 3}) { id } }")) == ["VALIDATION_ERROR"]
    # Variables of the wrong type.
    body = gql(srv, "query($id: String!) { pod(input: {podId: $id}) { id } }", variables={"id": 5})
    assert codes(body) == ["VALIDATION_ERROR"]
    body = gql(
        srv, "query($id: String!) { pod(input: {podId: $id}) { id } }", variables={"id": cid}
    )
    assert body == {"data": {"pod": {"id": cid}}}
    # A read-only key may not mutate.
    with srv.server.ctx.transaction() as session:
        admin = session.execute(
            __import__("sqlalchemy").text("select user_id, account_id from api_keys limit 1")
        ).one()
        ro = issue_key(session, user_id=admin[0], account_id=admin[1], name="ro", scope=Scope.READ)
    assert codes(
        gql(srv, f'mutation {{ podStop(input: {{podId: "{cid}"}}) {{ id }} }}', key=ro.key)
    ) == ["FORBIDDEN"]
    assert (
        gql(srv, f'{{ pod(input: {{podId: "{cid}"}}) {{ id }} }}', key=ro.key)["data"]["pod"]["id"]
        == cid
    )


def test_internal_errors_are_masked(
    srv: LiveServer, fake_runtime: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    cid = deploy(srv)

    def boom(cluster_id: str) -> None:
        raise RuntimeError("secret internals")

    monkeypatch.setattr(fake_runtime, "stats", boom)
    body = gql(
        srv,
        f'{{ pod(input: {{podId: "{cid}"}}) {{ id runtime {{ container {{ cpuPercent }} }} }} }}',
    )
    assert codes(body) == ["INTERNAL_ERROR"]
    assert "secret" not in json.dumps(body)
    assert body["data"]["pod"]["id"] == cid and body["data"]["pod"]["runtime"]["container"] is None


def test_auth(srv: LiveServer) -> None:
    q = {"query": "{ myself { id } }"}
    for kwargs in (
        {},
        {"params": {"api_key": "gy_wrong"}},
        {"headers": {"Authorization": "Bearer gy_wrong"}},
    ):
        r = httpx.post(f"{srv.url}/graphql", json=q, **kwargs, verify=trusted_tls())  # type: ignore[arg-type]
        assert r.status_code == 401
        assert r.headers["www-authenticate"] == "Bearer"
        assert codes(r.json()) == ["UNAUTHORIZED"] and r.json()["errors"][0]["message"]
    ok_header = httpx.post(
        f"{srv.url}/graphql",
        json=q,
        headers={"Authorization": f"Bearer {srv.key}"},
        verify=trusted_tls(),
    )
    ok_query = httpx.post(
        f"{srv.url}/graphql", json=q, params={"api_key": srv.key}, verify=trusted_tls()
    )
    ok_bare = httpx.post(
        f"{srv.url}/graphql", json=q, headers={"Authorization": srv.key}, verify=trusted_tls()
    )
    assert ok_header.json() == ok_query.json() == ok_bare.json()
    assert ok_header.json()["data"]["myself"]["id"]


def test_get_runs_queries_only(srv: LiveServer) -> None:
    r = httpx.get(
        f"{srv.url}/graphql",
        params={"query": "{ myself { id } }", "api_key": srv.key},
        verify=trusted_tls(),
    )
    assert r.status_code == 200 and r.json()["data"]["myself"]["id"]
    r = httpx.get(
        f"{srv.url}/graphql",
        params={"query": 'mutation { podStop(input: {podId: "x"}) { id } }', "api_key": srv.key},
        verify=trusted_tls(),
    )
    assert codes(r.json()) == ["VALIDATION_ERROR"] and "POST" in r.json()["errors"][0]["message"]


def test_bad_requests(srv: LiveServer) -> None:
    h = {"Authorization": f"Bearer {srv.key}", "content-type": "application/json"}
    for body in (
        "not json",
        "{}",
        '{"query": 3}',
        '{"query": "{ myself { id } }", "variables": 3}',
        "[]",
    ):
        r = httpx.post(f"{srv.url}/graphql", content=body, headers=h, verify=trusted_tls())
        assert r.status_code == 400, body
        assert codes(r.json()) == ["VALIDATION_ERROR"]


def test_limits(srv: LiveServer) -> None:
    deep = "{ myself { clusters { machine { id } " + "runtime { ports { ip } } " * 1 + "} } }"
    assert "errors" not in gql(srv, deep)
    nested = "{ __schema { types { fields { type { " + "ofType { " * 12 + "name" + " }" * 16 + " }"
    body = gql(srv, nested)
    assert (
        codes(body) == ["VALIDATION_ERROR"]
        and body["errors"][0]["extensions"]["details"]["limit"] == "depth"
    )
    aliases = "{ " + " ".join(f"a{i}: myself {{ id }}" for i in range(31)) + " }"
    body = gql(srv, aliases)
    assert body["errors"][0]["extensions"]["details"]["limit"] == "aliases"
    tokens = "{ myself { " + "id " * 2100 + "} }"
    body = gql(srv, tokens)
    assert body["errors"][0]["extensions"]["details"]["limit"] == "tokens"
    h = {"Authorization": f"Bearer {srv.key}"}
    batch = [{"query": "{ myself { id } }"}] * 3
    r = httpx.post(f"{srv.url}/graphql", json=batch, headers=h, verify=trusted_tls())
    assert r.status_code == 200 and [b["data"]["myself"]["id"] for b in r.json()] == ["1"] * 3
    r = httpx.post(
        f"{srv.url}/graphql",
        json=[{"query": "{ myself { id } }"}] * 11,
        headers=h,
        verify=trusted_tls(),
    )
    assert r.status_code == 400 and "batch" in r.json()["errors"][0]["message"]
    r = httpx.post(
        f"{srv.url}/graphql",
        json={"query": "{ " + " " * 40_000 + "}"},
        headers=h,
        verify=trusted_tls(),
    )
    assert r.status_code == 413
    # Introspection is on by default (clients use it); the standard query passes the limits.
    from graphql import get_introspection_query

    intro = gql(srv, get_introspection_query())
    assert "errors" not in intro and intro["data"]["__schema"]["queryType"]["name"] == "Query"


def test_introspection_can_be_disabled(
    tmp_path: Any, fake_runtime: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.helpers import live_server, make_settings

    monkeypatch.setenv("GPUYARD_GRAPHQL_INTROSPECTION", "false")
    with live_server(make_settings(tmp_path / "home"), fake_runtime) as srv:
        body = gql(srv, "{ __schema { queryType { name } } }")
        assert set(codes(body)) == {"VALIDATION_ERROR"} and "data" not in body
        assert gql(srv, "{ myself { id } }")["data"]["myself"]["id"]


def test_accounts_are_isolated(srv: LiveServer) -> None:
    mine = deploy(srv)
    with srv.server.ctx.transaction() as session:
        user, account, _ = create_account(session, email="b@example.com", name="b")
        other = issue_key(
            session, user_id=user.id, account_id=account.id, name="b", scope=Scope.WRITE
        )
    theirs = deploy(srv, other.key)
    lst = "{ myself { id clusters { id } pods { id } currentSpendPerHr } }"
    a = gql(srv, lst)["data"]["myself"]
    b = gql(srv, lst, key=other.key)["data"]["myself"]
    assert a["clusters"] == a["pods"] == [{"id": mine}]
    assert b["clusters"] == b["pods"] == [{"id": theirs}] and a["id"] != b["id"]
    for name, arg in (("cluster", "clusterId"), ("pod", "podId")):
        body = gql(srv, f'{{ {name}(input: {{{arg}: "{theirs}"}}) {{ id }} }}')
        assert codes(body) == ["CLUSTER_NOT_FOUND"] and body["data"] == {name: None}
    for m in ("podStop", "podTerminate", "clusterStop", "clusterTerminate"):
        arg = "podId" if m.startswith("pod") else "clusterId"
        sel = "" if m.endswith("Terminate") else "{ id }"
        body = gql(srv, f'mutation {{ {m}(input: {{{arg}: "{theirs}"}}) {sel} }}')
        assert codes(body) == ["CLUSTER_NOT_FOUND"], m
    body = gql(srv, f'mutation {{ podResume(input: {{podId: "{theirs}", gpuCount: 1}}) {{ id }} }}')
    assert codes(body) == ["CLUSTER_NOT_FOUND"]
    assert gql(srv, lst, key=other.key)["data"]["myself"]["clusters"] == [{"id": theirs}]
    with httpx.Client(
        base_url=srv.url, headers={"Authorization": f"Bearer {other.key}"}, verify=trusted_tls()
    ) as c:
        assert c.get(f"/v1/clusters/{theirs}").json()["data"]["status"] == "running"
