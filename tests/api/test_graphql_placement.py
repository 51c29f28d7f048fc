"""GraphQL deploys pinned to a data centre: ``dataCenterId`` is a host location."""

from __future__ import annotations

from gpuyard.store.schema import Host, HostGpu
from tests.api.test_graphql import codes, gql
from tests.helpers import LiveServer

DEPLOY = (
    'mutation { podFindAndDeployOnDemand(input: {gpuTypeId: "NVIDIA RTX A6000", '
    'imageName: "x", gpuCount: 1, dataCenterId: "DC"}) { id machine { location } } }'
)


def add_host(srv: LiveServer, name: str, location: str) -> None:
    with srv.server.ctx.transaction() as s:
        host = Host(
            name=name,
            location=location,
            cloud_type="SECURE",
            address=f"{name}.example",
            engine_url=f"ssh://root@{name}.example",
            vcpus=32,
            memory_gb=256,
            disk_gb=2000,
            gpu_source="declared",
            declared=[],
        )
        s.add(host)
        s.flush()
        s.add(HostGpu(host_id=host.id, gpu_index=0, gpu_type="NVIDIA RTX A6000"))


def test_data_center_id_pins_the_location(srv: LiveServer) -> None:
    add_host(srv, "eu1", "eu-west")
    # Binpack alone would take the 1-GPU host; the pin keeps it on the local machine.
    pod = gql(srv, DEPLOY.replace("DC", "local"))["data"]["podFindAndDeployOnDemand"]
    assert pod["machine"]["location"] == "local"
    pod = gql(srv, DEPLOY.replace("DC", "eu-west"))["data"]["podFindAndDeployOnDemand"]
    assert pod["machine"]["location"] == "eu-west"
    # The location is known, and full.
    full = gql(srv, DEPLOY.replace("DC", "eu-west"))
    assert codes(full) == ["INSUFFICIENT_CAPACITY"]
    # No host is there: an input error on the field.
    unknown = gql(srv, DEPLOY.replace("DC", "mars"))
    assert codes(unknown) == ["VALIDATION_ERROR"]
    details = unknown["errors"][0]["extensions"]["details"]
    assert details["field"] == "input.dataCenterId"
    assert details["locations"] == ["eu-west", "local"]
    # Empty, as some clients send it: anywhere.
    pod = gql(srv, DEPLOY.replace('"DC"', '""'))["data"]["podFindAndDeployOnDemand"]
    assert pod["machine"]["location"] == "local"
