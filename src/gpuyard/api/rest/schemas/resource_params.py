"""Parameters shared by the training-resource routers: the ``project_id`` and
``active_iam`` query parameters, each rejected with a 400 naming it when malformed
or out of the store's id range."""

from __future__ import annotations

from fastapi import Request
from sqlalchemy.orm import Session

from gpuyard.core.input_rules import parse_id
from gpuyard.services.tenancy.auth import Principal
from gpuyard.services.tenancy.projects import (
    ProjectRef,
    ResourceScope,
    acting_account,
    project_of_ref,
    resource_scope,
)
from gpuyard.store.schema import Project


def query_id(request: Request, name: str) -> int | None:
    """An optional integer id from the query string, 1..MAX_DB_ID; None when absent.
    Raises ValidationFailed(name) for anything else (path ids are api/http/path_ids.py's)."""
    return parse_id(name, request.query_params.get(name))


def project_ref(request: Request) -> ProjectRef:
    """The ``project_id`` and ``active_iam`` query parameters, in that order, each
    rejected with ValidationFailed naming it when malformed."""
    return ProjectRef(query_id(request, "project_id"), query_id(request, "active_iam"))


def account_of(session: Session, principal: Principal, request: Request) -> int:
    """The acting account (``active_iam``). Raises ValidationFailed / Forbidden."""
    return acting_account(session, principal, query_id(request, "active_iam"))


def project_of(session: Session, principal: Principal, request: Request) -> Project:
    """``project_id`` (default: the acting account's default project) of the acting
    account. Raises ValidationFailed, ProjectNotFound or Forbidden."""
    return project_of_ref(session, principal, project_ref(request))


def scope_of(session: Session, principal: Principal, request: Request) -> ResourceScope:
    """For reads and writes of one resource by id: the acting account and, when
    ``project_id`` was given, that project (validated: another account's is 404)."""
    return resource_scope(session, principal, project_ref(request))
