"""Projects and acting for another account (``active_iam``).

A key acts for its own account. With ``active_iam`` (the id of a membership row) a
user acts for another account they are a member of; a membership that is not the
caller's is ``403``. A project of another account is ``404`` (never revealing that it
exists).
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpuyard.core.errors import Forbidden, NotFound, ValidationFailed
from gpuyard.services.auth import Principal
from gpuyard.services.resource_util import in_id_range
from gpuyard.store.schema import Member, Project


class ProjectNotFound(NotFound):
    code = "PROJECT_NOT_FOUND"


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


def list_projects(session: Session, account_id: int) -> list[Project]:
    return list(
        session.scalars(
            select(Project).where(Project.account_id == account_id).order_by(Project.id)
        )
    )


def create_project(session: Session, account_id: int, name: str) -> Project:
    name = name.strip()
    if not name or len(name) > 200:
        raise ValidationFailed("name", "must be 1 to 200 characters")
    project = Project(account_id=account_id, name=name, is_default=False)
    session.add(project)
    session.flush()
    return project
