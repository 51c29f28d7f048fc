"""What RunPod clients such as SkyPilot read of a pod and a GPU type, over real
HTTP: a host's ``client_address`` (the operator's setting, REST ``PATCH
/v1/hosts/{id}``), the ports a running pod lists (SSH public at that address even on
loopback, http ports at the container's own address and not public), pods being
terminated leaving the list, and LowestPrice's capacity fields."""

from __future__ import annotations

from typing import Any

import httpx

from gpuyard.core.tls_trust import trusted_tls
from gpuyard.store.schema import Host
from tests.helpers import LiveServer, account_with_members, v1_error

DEPLOY = (
    'mutation { podFindAndDeployOnDemand(input: {gpuTypeId: "NVIDIA RTX A6000", '
    'gpuCount: 1, imageName: "busybox", ports: "22/tcp,8265/http,9000/tcp"}) { id } }'
)
PODS = (
    "query { myself { pods { id desiredStatus runtime { ports { ip isIpPublic privatePort "
    "publicPort type } } } } }"
)
LOWEST = """query { gpuTypes(input: {id: "NVIDIA RTX A6000"}) { id
  lowestPrice(input: {gpuCount: %d, minDisk: 20, compliance: [], countryCode: "US"}) {
    gpuName gpuTypeId minimumBidPrice uninterruptablePrice minVcpu minMemory stockStatus
    compliance maxUnreservedGpuCount availableGpuCounts totalCount rentedCount
    rentalPercentage minDisk minDownload minUpload countryCode supportPublicIp } } }"""


def local_host_id(srv: LiveServer) -> int:
    with srv.server.ctx.read() as s:
        host = s.query(Host).filter(Host.is_local.is_(True)).one()
        assert host.address in ("127.0.0.1", "localhost"), host.address
        return host.id


def data(body: dict[str, Any]) -> dict[str, Any]:
    assert "errors" not in body, body
    out: dict[str, Any] = body["data"]
    return out


def running_pod(srv: LiveServer, key: str | None = None) -> dict[str, Any]:
    pid = data(srv.graphql(DEPLOY, key=key))["podFindAndDeployOnDemand"]["id"]
    assert srv.server.reconciler.wait_idle(10)
    pods = data(srv.graphql(PODS, key=key))["myself"]["pods"]
    pod: dict[str, Any] = next(p for p in pods if p["id"] == pid)
    assert pod["desiredStatus"] == "RUNNING" and pod["runtime"], pod
    return pod


def test_the_ssh_port_is_public_at_the_client_address(srv: LiveServer) -> None:
    host_id = local_host_id(srv)
    with srv.client() as c:
        r = c.patch(f"/v1/hosts/{host_id}", json={"client_address": "127.0.0.2"})
        assert r.status_code == 200, r.text
        assert r.json()["data"]["client_address"] == "127.0.0.2"
        assert c.get(f"/v1/hosts/{host_id}").json()["data"]["client_address"] == "127.0.0.2"
    pod = running_pod(srv)
    ports = {p["privatePort"]: p for p in pod["runtime"]["ports"]}
    ssh, http = ports[22], ports[8265]
    # Loopback, yet public: clients connect only to an entry that says so.
    assert ssh["isIpPublic"] is True and ssh["ip"] == "127.0.0.2" and ssh["type"] == "tcp"
    assert ssh["publicPort"] and ssh["publicPort"] != 22
    # Any published tcp port: where clients reach it.
    assert ports[9000]["isIpPublic"] is True and ports[9000]["ip"] == "127.0.0.2"
    # The http port: at the container's own address, not public (the proxy's).
    assert http["isIpPublic"] is False and http["type"] == "http"
    assert http["ip"] and http["ip"] not in ("127.0.0.1", "127.0.0.2")

    # Back to the host's own address: the SSH entry shows it, still public.
    with srv.client() as c:
        r = c.patch(f"/v1/hosts/{host_id}", json={"client_address": None})
        assert r.status_code == 200 and r.json()["data"]["client_address"] is None
    pods = data(srv.graphql(PODS))["myself"]["pods"]
    ssh = next(p for p in pods[0]["runtime"]["ports"] if p["privatePort"] == 22)
    assert ssh["isIpPublic"] is True and ssh["ip"] == "127.0.0.1"


def test_a_pod_being_terminated_leaves_the_list(srv: LiveServer) -> None:
    pod = running_pod(srv)
    done = data(srv.graphql(f'mutation {{ podTerminate(input: {{podId: "{pod["id"]}"}}) }}'))
    assert "podTerminate" in done
    # SkyPilot knows CREATED, RESTARTING, PAUSED and RUNNING only.
    listed = data(srv.graphql(PODS))["myself"]["pods"]
    assert pod["id"] not in [p["id"] for p in listed]


def test_the_client_address_is_validated(srv: LiveServer) -> None:
    host_id = local_host_id(srv)
    with srv.client() as c:
        for bad in ("not an address", "a..b", "-x.example", "", "x" * 300, 7):
            r = c.patch(f"/v1/hosts/{host_id}", json={"client_address": bad})
            err = v1_error(r, 400, "VALIDATION_ERROR")
            assert "client_address" in str(err), err
        v1_error(c.patch(f"/v1/hosts/{host_id}", json={"nope": 1}), 400, "VALIDATION_ERROR")
        ok = c.patch(f"/v1/hosts/{host_id}", json={"client_address": "gpu1.example.org"})
        assert ok.status_code == 200 and ok.json()["data"]["client_address"] == "gpu1.example.org"
        ok = c.patch(f"/v1/hosts/{host_id}", json={"client_address": "2001:db8::7"})
        assert ok.status_code == 200, ok.text
        # A field left out stays as it is.
        same = c.patch(f"/v1/hosts/{host_id}", json={})
        assert same.json()["data"]["client_address"] == "2001:db8::7"
        v1_error(c.patch("/v1/hosts/999999", json={"client_address": "a.b"}), 404)
        # Set when a host is added.
        r = c.post(
            "/v1/hosts",
            json={
                "name": "h2",
                "engine_url": "tcp://127.0.0.1:1",
                "client_address": "203.0.113.8",
            },
        )
        assert r.status_code == 201, r.text
        assert r.json()["data"]["client_address"] == "203.0.113.8"
        bad = c.post(
            "/v1/hosts",
            json={"name": "h3", "engine_url": "tcp://127.0.0.1:2", "client_address": "a b"},
        )
        assert "client_address" in str(v1_error(bad, 400, "VALIDATION_ERROR"))


def test_only_the_operator_sets_it(srv: LiveServer) -> None:
    host_id = local_host_id(srv)
    _, _, keys = account_with_members(srv, "other@client-address.test", ("admin", "member"))
    for role, key in keys.items():
        with srv.client(key) as c:
            r = c.patch(f"/v1/hosts/{host_id}", json={"client_address": "198.51.100.9"})
            assert r.status_code in (403, 404), (role, r.text)
    with srv.client() as c:
        assert c.get(f"/v1/hosts/{host_id}").json()["data"]["client_address"] is None
    # Another account's pods answer its own view, never the operator's host list.
    pod = running_pod(srv, keys["owner"])
    assert any(p["isIpPublic"] for p in pod["runtime"]["ports"])


def test_lowest_price_from_the_fleet(srv: LiveServer) -> None:
    one = data(srv.graphql(LOWEST % 1))["gpuTypes"][0]["lowestPrice"]
    # The local host: 4 RTX A6000, none held.
    assert one["gpuName"] == "RTX A6000"
    assert one["gpuTypeId"] == "NVIDIA RTX A6000"
    assert one["minVcpu"] == 2 and one["minMemory"] == 4
    assert one["maxUnreservedGpuCount"] == 4 and one["availableGpuCounts"] == [1, 2, 4]
    assert one["totalCount"] == 4 and one["rentedCount"] == 0 and one["rentalPercentage"] == 0
    assert one["compliance"] == [] and one["minDisk"] == 20 and one["countryCode"] == "US"
    assert one["minDownload"] is None and one["supportPublicIp"] is None
    running_pod(srv)
    after = data(srv.graphql(LOWEST % 1))["gpuTypes"][0]["lowestPrice"]
    assert after["maxUnreservedGpuCount"] == 3 and after["rentedCount"] == 1
    assert after["rentalPercentage"] == 0.25
    # More than any host has free: nothing qualifies.
    big = data(srv.graphql(LOWEST % 8))["gpuTypes"][0]["lowestPrice"]
    assert big["minVcpu"] is None and big["minMemory"] is None
    assert big["maxUnreservedGpuCount"] == 0 and big["availableGpuCounts"] == [1, 2]


def test_lowest_price_over_plain_http(srv: LiveServer) -> None:
    """The catalog fetcher's own request shape: the key in the URL, a JSON body."""
    r = httpx.post(
        f"{srv.url}/graphql?api_key={srv.key}",
        json={"query": LOWEST % 2},
        timeout=30,
        verify=trusted_tls(),
    )
    assert r.status_code == 200, r.text
    price = data(r.json())["gpuTypes"][0]["lowestPrice"]
    assert price["maxUnreservedGpuCount"] == 4 and price["minVcpu"] == 2
