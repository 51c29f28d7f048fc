"""One host shape: ``GET /v1/hosts`` answers api/rest/schemas/hosts.py HostOut's fields, taken
from services/fleet/views.py HostView's same-named fields; what either has beyond the
other is named here, so a field added to one side only fails this test."""

from __future__ import annotations

from dataclasses import fields

from gpuyard.api.rest.schemas.hosts import HostOut, HostWorkload
from gpuyard.services.fleet.views import HostView, Workload

# Worked out by the API from the view (or, for proxy, by the route).
API_ONLY = {"engine", "inventory", "gpus", "free", "clusters", "proxy"}
# Answered under another name or shape: the workloads are ``clusters``.
VIEW_ONLY = {"workloads"}


def test_the_view_and_the_schema_name_the_same_fields() -> None:
    view = {f.name for f in fields(HostView)}
    answer = set(HostOut.model_fields)
    assert answer - view == API_ONLY
    assert view - answer == VIEW_ONLY


def test_a_workload_is_answered_field_for_field() -> None:
    assert [f.name for f in fields(Workload)] == list(HostWorkload.model_fields)
