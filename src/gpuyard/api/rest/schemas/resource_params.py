"""Parameters shared by the training-resource routers: the ``project_id`` and
``active_iam`` query parameters, each rejected with a 400 naming it when malformed
or out of the store's id range."""

from __future__ import annotations

from fastapi import Request

from gpuyard.core.input_rules import parse_id
from gpuyard.services.tenancy.projects import ProjectRef


def query_id(request: Request, name: str) -> int | None:
    """An optional integer id from the query string, 1..MAX_DB_ID; None when absent.
    Raises ValidationFailed(name) for anything else (path ids are api/http/path_ids.py's)."""
    return parse_id(name, request.query_params.get(name))


def project_ref(request: Request) -> ProjectRef:
    """The ``project_id`` and ``active_iam`` query parameters, in that order, each
    rejected with ValidationFailed naming it when malformed."""
    return ProjectRef(query_id(request, "project_id"), query_id(request, "active_iam"))
