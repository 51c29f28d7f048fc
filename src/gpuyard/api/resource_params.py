"""Parameters shared by the training-resource routers: path ids, ``project_id`` and
``active_iam`` query parameters, each rejected with a 400 naming it when malformed."""

from __future__ import annotations

import re

from fastapi import Request
from sqlalchemy.orm import Session

from gpuyard.core.errors import ValidationFailed
from gpuyard.services.auth import Principal
from gpuyard.services.projects import (
    ProjectRef,
    ResourceScope,
    acting_account,
    parse_int,
    project_of_ref,
    resource_scope,
)
from gpuyard.services.requests import MAX_ID
from gpuyard.store.schema import Project

# Plain decimal digits: int() would also take " 7", "7_0" or non-ASCII digits.
_DIGITS = re.compile(r"[0-9]+", re.ASCII)


def path_id(name: str, value: str) -> int:
    """An integer id from the path. Raises ValidationFailed(name) when it is not one;
    an id beyond the store's range is returned as is and then matches nothing (404)."""
    if not _DIGITS.fullmatch(value):
        raise ValidationFailed(name, f"{value[:40]!r} is not an integer id")
    # Far beyond any id either way; int() would refuse thousands of digits.
    return int(value) if len(value) <= 20 else MAX_ID + 1


def query_id(request: Request, name: str) -> int | None:
    """An optional integer id from the query string; None when absent."""
    value = parse_int(name, request.query_params.get(name), required=False)
    if value is not None and not 1 <= value <= MAX_ID:
        raise ValidationFailed(name, f"must be between 1 and {MAX_ID}")
    return value


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
