"""GraphQL deploys pinned to a data centre: ``dataCenterId`` is a host location."""

from __future__ import annotations

from tests.api.test_graphql import codes, gql
from tests.helpers import LiveServer, add_host_row

DEPLOY = (
    'mutation { podFindAndDeployOnDemand(input: {gpuTypeId: "NVIDIA RTX A6000", '
    'imageName: "x", gpuCount: 1, dataCenterId: "DC"}) { id machine { location } } }'
)


def test_data_center_id_pins_the_location(srv: LiveServer) -> None:
    add_host_row(srv.server.ctx, "eu1", 1, location="eu-west")
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
