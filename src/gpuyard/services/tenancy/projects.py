"""Projects and acting for another account (``active_iam``).

A key acts for its own account. With ``active_iam`` (the id of a membership row) a
user acts for another account they are a member of; a membership that is not the
caller's is ``403``. A project of another account is ``404`` (never revealing that it
exists).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import ColumnElement, delete, select, true, update
from sqlalchemy.orm import InstrumentedAttribute, Session

from gpuyard.core.errors import Conflict, Forbidden, GpuyardError, NotFound, ValidationFailed
from gpuyard.core.roles import Permission
from gpuyard.core.states import ClusterStatus
from gpuyard.core.training.clusters import TrainingStatus
from gpuyard.services.access.resource_util import in_id_range
from gpuyard.services.context import Context
from gpuyard.services.owned_rows import owned_row
from gpuyard.services.tenancy.audit import record_audit
from gpuyard.services.tenancy.auth import Principal
from gpuyard.store.schema import (
    ApiKey,
    Cluster,
    ClusterTemplate,
    Member,
    NetworkVolume,
    Project,
    ProjectMember,
    Quota,
    ReservedIp,
    SecurityGroup,
    Snapshot,
    TrainingCluster,
    User,
)


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
    """Whose resources a request reads or writes: the acting account, the project
    the caller named (None: not named) and the projects the caller may use there
    (None: every one; a key restricted to a project, or a member given some)."""

    account_id: int
    project_id: int | None
    allowed: frozenset[int] | None = None

    def covers(self, project_id: int) -> bool:
        """Whether a resource of project ``project_id`` (of the scope's account) is in
        the scope: the named project, if any, and one the caller may use."""
        if self.project_id is not None and project_id != self.project_id:
            return False
        return self.allowed is None or project_id in self.allowed


# -- the one project-scope check ------------------------------------------------------
# Every resource that belongs to a project (clusters, network volumes, snapshots,
# reserved IPs, security groups) is visible to a caller only in the projects it may
# use: ``Principal.may_use_project`` for one row, ``in_usable_projects`` for a query,
# ``project_for_create`` for where a new one lands. Out of scope is "not found", like
# another account's.


def in_usable_projects(
    principal: Principal, column: InstrumentedAttribute[int]
) -> ColumnElement[bool]:
    """A WHERE clause on a ``project_id`` column: the rows of projects ``principal``
    may use (always true for a caller not restricted to some projects)."""
    if principal.project_ids is None:
        return true()
    return column.in_(sorted(principal.project_ids))


def project_for_create(session: Session, principal: Principal, project_id: int | None) -> int:
    """The project a create lands in: ``project_id`` when it is the acting account's
    and one the caller may use, else (None) the caller's default. A project of another
    account, or one the caller is not given (a key or membership restricted to some
    projects), is NotFound (404) like none."""
    if project_id is None:
        if not principal.may_use_project(principal.default_project_id):
            # A key restricted to a project its user no longer has: no project at all.
            raise NotFound(
                "this caller may use no project of this account",
                {"project_id": principal.default_project_id},
            )
        return principal.default_project_id
    owner = (
        session.scalar(select(Project.account_id).where(Project.id == project_id))
        if in_id_range(project_id)
        else None
    )
    if owner != principal.account_id or not principal.may_use_project(project_id):
        raise NotFound(f"project {project_id} not found", {"project_id": project_id})
    return project_id


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
    acting account's default project when None. A caller restricted to some projects
    (``principal.project_ids``) gets its own default, and a project outside them is
    404 like another account's. Raises ProjectNotFound / Forbidden."""
    account_id = acting_account(session, principal, active_iam)
    # The principal's project restriction is of its acting account (api/state.py
    # resolves active_iam into it; a service caller may name another).
    restricted = account_id == principal.account_id and principal.project_ids is not None

    def missing() -> ProjectNotFound:
        return ProjectNotFound(f"project {project_id} not found", {"project_id": project_id})

    if project_id is not None:
        return owned_row(
            session,
            Project,
            project_id,
            account_id,
            missing,
            visible=lambda p: not restricted or principal.may_use_project(p.id),
        )
    if restricted:
        project = session.get(Project, principal.default_project_id)
    else:
        project = session.scalar(
            select(Project)
            .where(Project.account_id == account_id)
            .order_by(Project.is_default.desc(), Project.id)
        )
    if (
        project is None
        or project.account_id != account_id
        or (restricted and not principal.may_use_project(project.id))
    ):
        raise missing()
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
    """For reads and writes of one resource by id: the acting account, when ``ref``
    names a project that project (validated: another account's, or one the caller may
    not use, is 404), and the projects the caller may use there."""
    account_id = acting_account(session, principal, ref.active_iam)
    # The principal's restriction is of its own acting account (see resolve_project).
    allowed = principal.project_ids if account_id == principal.account_id else None
    if ref.project_id is None:
        return ResourceScope(account_id, None, allowed)
    project = project_of_ref(session, principal, ref)
    return ResourceScope(project.account_id, project.id, allowed)


def list_projects(ctx: Context, principal: Principal, active_iam: int | None) -> list[Project]:
    """The projects of the acting account, oldest first; a key restricted to a project
    sees only that one (it acts nowhere else). Raises Forbidden."""
    with ctx.read() as session:
        account_id = acting_account(session, principal, active_iam)
        q = select(Project).where(Project.account_id == account_id)
        if principal.key_project_id is not None:
            q = q.where(Project.id == principal.key_project_id)
        return list(session.scalars(q.order_by(Project.id)))


def create_project(
    ctx: Context, principal: Principal, active_iam: int | None, name: str
) -> Project:
    """A new, non-default project of the acting account. Raises Forbidden, or
    ValidationFailed("name") for a blank or over-long name. Needs ``manage_projects``."""
    principal.require_permission(Permission.MANAGE_PROJECTS)
    with ctx.transaction() as session:
        account_id = acting_account(session, principal, active_iam)
        name = name.strip()
        if not name or len(name) > 200:
            raise ValidationFailed("name", "must be 1 to 200 characters")
        project = Project(account_id=account_id, name=name, is_default=False)
        session.add(project)
        session.flush()
        record_audit(
            session,
            principal,
            account_id=account_id,
            action="project.create",
            target_type="project",
            target_id=project.id,
            detail={"name": name},
            now=ctx.clock.now(),
        )
        return project


class ProjectNotEmpty(GpuyardError):
    """A project still holding live resources cannot be deleted; ``details`` lists
    them by kind (ids)."""

    code = "PROJECT_NOT_EMPTY"
    http_status = 409


def _own_project(session: Session, principal: Principal, project_id: int) -> Project:
    """A project of the acting account the caller may act in, else ProjectNotFound."""
    return owned_row(
        session,
        Project,
        project_id,
        principal.account_id,
        lambda: ProjectNotFound(f"project {project_id} not found", {"project_id": project_id}),
        visible=lambda p: principal.may_use_project(p.id),
    )


def rename_project(ctx: Context, principal: Principal, project_id: int, name: str) -> Project:
    """Rename a project of the acting account. Needs ``manage_projects``. Raises
    Forbidden, ProjectNotFound, ValidationFailed."""
    principal.require_permission(Permission.MANAGE_PROJECTS)
    name = name.strip()
    if not name or len(name) > 200:
        raise ValidationFailed("name", "must be 1 to 200 characters")
    with ctx.transaction() as session:
        project = _own_project(session, principal, project_id)
        if project.name != name:
            record_audit(
                session,
                principal,
                account_id=project.account_id,
                action="project.rename",
                target_type="project",
                target_id=project.id,
                detail={"from": project.name, "to": name},
                now=ctx.clock.now(),
            )
            project.name = name
        session.flush()
        return project


def project_contents(session: Session, project_id: int) -> dict[str, list[str]]:
    """What keeps a project from being deleted, by kind: clusters not terminated,
    network volumes and snapshots not deleted, training clusters not deleted,
    reserved IPs, security groups, templates and live keys restricted to it."""
    found: dict[str, list[str]] = {}

    def add(kind: str, ids: Iterable[object]) -> None:
        listed = [str(i) for i in ids]
        if listed:
            found[kind] = listed[:50]

    add(
        "clusters",
        session.scalars(
            select(Cluster.id).where(
                Cluster.project_id == project_id, Cluster.status != ClusterStatus.TERMINATED.value
            )
        ),
    )
    add(
        "network_volumes",
        session.scalars(
            select(NetworkVolume.id).where(
                NetworkVolume.project_id == project_id, NetworkVolume.deleted_at.is_(None)
            )
        ),
    )
    add(
        "snapshots",
        session.scalars(
            select(Snapshot.id).where(
                Snapshot.project_id == project_id, Snapshot.deleted_at.is_(None)
            )
        ),
    )
    add(
        "training_clusters",
        session.scalars(
            select(TrainingCluster.id).where(
                TrainingCluster.project_id == project_id,
                TrainingCluster.status != TrainingStatus.DELETED.value,
            )
        ),
    )
    add(
        "reserved_ips",
        session.scalars(select(ReservedIp.id).where(ReservedIp.project_id == project_id)),
    )
    add(
        "security_groups",
        session.scalars(select(SecurityGroup.id).where(SecurityGroup.project_id == project_id)),
    )
    add(
        "templates",
        session.scalars(select(ClusterTemplate.id).where(ClusterTemplate.project_id == project_id)),
    )
    add(
        "api_keys",
        session.scalars(
            select(ApiKey.id).where(ApiKey.project_id == project_id, ApiKey.revoked_at.is_(None))
        ),
    )
    return found


def delete_project(ctx: Context, principal: Principal, project_id: int) -> None:
    """Delete an empty, non-default project of the acting account. The rows of what it
    once held (terminated clusters, deleted volumes and snapshots) move to the
    account's default project (usage records keep the project they were billed to);
    revoked keys restricted to it lose the restriction's project. Raises
    ProjectNotFound, Conflict (the default project), ProjectNotEmpty. Needs
    ``manage_projects`` (Forbidden)."""
    principal.require_permission(Permission.MANAGE_PROJECTS)
    with ctx.transaction() as session:
        project = _own_project(session, principal, project_id)
        if project.is_default:
            raise Conflict("the default project cannot be deleted", {"project_id": project_id})
        left = project_contents(session, project_id)
        if left:
            raise ProjectNotEmpty(
                f"project {project_id} still holds "
                + ", ".join(f"{len(v)} {k}" for k, v in left.items()),
                {"project_id": project_id, "left": left},
            )
        default = session.scalar(
            select(Project.id).where(
                Project.account_id == project.account_id, Project.is_default.is_(True)
            )
        )
        if default is None:
            raise Conflict("the account has no default project", {"project_id": project_id})
        for table in (Cluster, NetworkVolume, Snapshot, TrainingCluster):
            session.execute(
                update(table).where(table.project_id == project_id).values(project_id=default)
            )
        session.execute(
            update(ApiKey).where(ApiKey.project_id == project_id).values(project_id=None)
        )
        session.execute(delete(ProjectMember).where(ProjectMember.project_id == project_id))
        session.execute(
            delete(Quota).where(
                Quota.account_id == project.account_id, Quota.project_id == project_id
            )
        )
        record_audit(
            session,
            principal,
            account_id=project.account_id,
            action="project.delete",
            target_type="project",
            target_id=project_id,
            detail={"name": project.name},
            now=ctx.clock.now(),
        )
        session.delete(project)


def list_project_members(
    ctx: Context, principal: Principal, project_id: int
) -> list[tuple[ProjectMember, Member, User]]:
    """The memberships given this project, oldest grant first. Raises ProjectNotFound."""
    with ctx.read() as session:
        _own_project(session, principal, project_id)
        return [
            (pm, m, u)
            for pm, m, u in session.execute(
                select(ProjectMember, Member, User)
                .join(Member, Member.id == ProjectMember.member_id)
                .join(User, User.id == Member.user_id)
                .where(ProjectMember.project_id == project_id)
                .order_by(ProjectMember.id)
            )
        ]


def add_project_member(
    ctx: Context, principal: Principal, project_id: int, member_id: int
) -> tuple[ProjectMember, Member, User]:
    """Give a membership of the account this project (a member or viewer with at least
    one project acts only in those). Raises ProjectNotFound, NotFound (member),
    Conflict (already given). Needs ``manage_projects`` (Forbidden)."""
    principal.require_permission(Permission.MANAGE_PROJECTS)
    with ctx.transaction() as session:
        project = _own_project(session, principal, project_id)
        member = owned_row(
            session,
            Member,
            member_id,
            project.account_id,
            lambda: NotFound(f"member {member_id} not found", {"member_id": member_id}),
        )
        exists = session.scalar(
            select(ProjectMember.id).where(
                ProjectMember.project_id == project_id, ProjectMember.member_id == member_id
            )
        )
        if exists is not None:
            raise Conflict(
                f"member {member_id} already has project {project_id}",
                {"member_id": member_id, "project_id": project_id},
            )
        row = ProjectMember(project_id=project_id, member_id=member_id, created_at=ctx.clock.now())
        session.add(row)
        session.flush()
        record_audit(
            session,
            principal,
            account_id=project.account_id,
            action="project_member.add",
            target_type="project",
            target_id=project_id,
            detail={"member_id": member_id, "user_id": member.user_id},
            now=ctx.clock.now(),
        )
        user = session.get(User, member.user_id)
        assert user is not None
        return row, member, user


def remove_project_member(
    ctx: Context, principal: Principal, project_id: int, member_id: int
) -> None:
    """Take this project from a membership. Raises ProjectNotFound, NotFound (the
    membership does not have it). Needs ``manage_projects`` (Forbidden)."""
    principal.require_permission(Permission.MANAGE_PROJECTS)
    with ctx.transaction() as session:
        project = _own_project(session, principal, project_id)
        row = (
            session.scalar(
                select(ProjectMember).where(
                    ProjectMember.project_id == project_id, ProjectMember.member_id == member_id
                )
            )
            if in_id_range(member_id)
            else None
        )
        if row is None:
            raise NotFound(
                f"member {member_id} does not have project {project_id}",
                {"member_id": member_id, "project_id": project_id},
            )
        session.delete(row)
        record_audit(
            session,
            principal,
            account_id=project.account_id,
            action="project_member.remove",
            target_type="project",
            target_id=project_id,
            detail={"member_id": member_id},
            now=ctx.clock.now(),
        )
