"""Projects and acting for another account (``active_iam``).

A key acts for its own account. With ``active_iam`` (the id of a membership row) a
user acts for another account they are a member of; a membership that is not the
caller's is ``403``. A project of another account is ``404`` (never revealing that it
exists).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpuyard.core.errors import Forbidden, NotFound, ValidationFailed
from gpuyard.services.auth import Principal
from gpuyard.services.context import Context
from gpuyard.services.resource_util import in_id_range
from gpuyard.store.schema import Member, Project


class ProjectNotFound(NotFound):
    code = "PROJECT_NOT_FOUND"


@dataclass(frozen=True)
class ProjectRef:
    """What a request named: its ``project_id`` and ``active_iam`` query parameters,
    well-formed but not yet checked against the store (None: not given)."""

    project_id: int | None = None
    active_iam: int | None = None


@dataclass(frozen=True)
class ResourceScope:
    """Whose resources a request reads or writes: the acting account and the
    project the caller named (None: not named)."""

    account_id: int
    project_id: int | None


def acting_account(session: Session, principal: Principal, active_iam: int | None) -> int:
    """The account the caller acts for. Raises Forbidden when ``active_iam`` names a
    membership that is not the caller's."""
    if active_iam is None:
        return principal.account_id
    member = session.get(Member, active_iam) if in_id_range(active_iam) else None
    if member is None or member.user_id != principal.user_id:
        raise Forbidden(f"active_iam {active_iam} is not a membership of this user")
    return member.account_id


def resolve_project(
    session: Session, principal: Principal, project_id: int | None, active_iam: int | None = None
) -> Project:
    """The project the request is about: ``project_id`` (of the acting account) or the
    acting account's default project when None. Raises ProjectNotFound / Forbidden."""
    account_id = acting_account(session, principal, active_iam)
    if project_id is None:
        project = session.scalar(
            select(Project)
            .where(Project.account_id == account_id)
            .order_by(Project.is_default.desc(), Project.id)
        )
    else:
        project = session.get(Project, project_id) if in_id_range(project_id) else None
    if project is None or project.account_id != account_id:
        raise ProjectNotFound(f"project {project_id} not found", {"project_id": project_id})
    return project


def parse_int(field: str, value: str | None, *, required: bool) -> int | None:
    """A query parameter that must be an integer; None when absent and optional."""
    if value is None or value == "":
        if required:
            raise ValidationFailed(field, "is required")
        return None
    try:
        return int(value)
    except ValueError as exc:
        raise ValidationFailed(field, f"{value!r} is not an integer") from exc


def project_of_ref(session: Session, principal: Principal, ref: ProjectRef) -> Project:
    """``ref.project_id`` (default: the acting account's default project) of the acting
    account. Raises ProjectNotFound or Forbidden."""
    return resolve_project(session, principal, ref.project_id, ref.active_iam)


def resource_scope(session: Session, principal: Principal, ref: ProjectRef) -> ResourceScope:
    """For reads and writes of one resource by id: the acting account and, when
    ``ref`` names a project, that project (validated: another account's is 404)."""
    if ref.project_id is None:
        return ResourceScope(acting_account(session, principal, ref.active_iam), None)
    project = project_of_ref(session, principal, ref)
    return ResourceScope(project.account_id, project.id)


def list_projects(ctx: Context, principal: Principal, active_iam: int | None) -> list[Project]:
    """The projects of the acting account, oldest first. Raises Forbidden."""
    with ctx.read() as session:
        account_id = acting_account(session, principal, active_iam)
        return list(
            session.scalars(
                select(Project).where(Project.account_id == account_id).order_by(Project.id)
            )
        )


def create_project(
    ctx: Context, principal: Principal, active_iam: int | None, name: str
) -> Project:
    """A new, non-default project of the acting account. Raises Forbidden, or
    ValidationFailed("name") for a blank or over-long name. The caller checks the
    write scope."""
    with ctx.transaction() as session:
        account_id = acting_account(session, principal, active_iam)
        name = name.strip()
        if not name or len(name) > 200:
            raise ValidationFailed("name", "must be 1 to 200 characters")
        project = Project(account_id=account_id, name=name, is_default=False)
        session.add(project)
        session.flush()
        return project
