"""OpenAPI models of ``/v1/endpoints``' answers (the bodies are
services/serverless/endpoint_inputs.py's). Like every answer model, unknown fields are
forbidden and the API tests validate real answers against them."""

from __future__ import annotations

from typing import Literal

from gpuyard.api.rest.schemas.resources import _envelope
from gpuyard.api.rest.schemas.responses import Pagination, StrictOut


class EndpointWorkers(StrictOut):
    # Ready and holding a job / ready and holding none / not yet taking jobs.
    running: int
    idle: int
    starting: int


class EndpointJobs(StrictOut):
    inQueue: int
    inProgress: int


class Endpoint(StrictOut):
    id: str
    name: str
    project_id: int
    template_id: str | None
    image: str
    gpu_type_ids: list[str]
    gpu_count: int
    cpu_cores: int
    memory_gb: int
    container_disk_gb: int
    volume_gb: int
    volume_mount_path: str
    workers_min: int
    workers_max: int
    idle_timeout_s: int
    scaler_type: Literal["QUEUE_DELAY", "REQUEST_COUNT"]
    scaler_value: int
    execution_timeout_ms: int
    # Secret values show as the mask; sending the mask back keeps them.
    env: dict[str, str]
    network_volume_id: str | None
    locations: list[str]
    flashboot: bool
    status: str
    # Why fewer workers run than the scaler wants (a quota, a budget, no capacity).
    capacity_problem: str | None
    version: int
    workers: EndpointWorkers
    jobs: EndpointJobs
    created_at: str | None
    updated_at: str | None


class EndpointList(StrictOut):
    endpoints: list[Endpoint]
    pagination: Pagination


class EndpointDeleted(StrictOut):
    id: str
    deleted: Literal[True]
    # The reconciler drains and stops its workers, then it is deleted.
    status: Literal["deleting"]


EndpointEnvelope = _envelope("EndpointEnvelope", Endpoint)
EndpointListEnvelope = _envelope("EndpointListEnvelope", EndpointList)
EndpointDeletedEnvelope = _envelope("EndpointDeletedEnvelope", EndpointDeleted)
