"""Whether a user, or one API key of theirs, may read or write a project's clusters
*now*: the one answer for every door that stays open past the request that opened
it — SSH keys at the gateway (each login, and every few seconds while a session is
open), the ``authorized_keys`` the gateway writes into clusters' sshd, web terminals
and log streams (re-checked every few seconds), and proxy sessions.

The rules are the ones services/tenancy/auth.py ``resolve_key`` applies to a request:

- the installation's operator (an admin user with a live admin-scoped key) may do
  everything;
- otherwise the user is a member of the project's account whose role allows
  ``read_resources`` (READ) or ``write_resources`` (WRITE), core/roles.py;
- a ``member`` or ``viewer`` given some projects acts only in those;
- access goes through a live API key: for a key, that key (unrevoked, acting in the
  account, its scope at least the need, its project restriction, if any, this
  project); for a user, at least one such key. A user whose last key is revoked
  (removing a membership revokes them all) holds no access, so their SSH keys and
  sessions stop too;
- an SSH key registered through a key restricted to a project opens only that
  project (``within_project``).

Every function reads the store and answers at once (a handful of indexed reads for
all the users asked about); nothing is cached here, so callers decide how fresh.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpuyard.core.roles import Permission, Role, role_allows
from gpuyard.services.context import Context
from gpuyard.services.tenancy.auth import Principal
from gpuyard.store.schema import ApiKey, Cluster, Member, Project, ProjectMember, User


class Need(StrEnum):
    READ = "read"
    WRITE = "write"


_PERMISSION = {Need.READ: Permission.READ_RESOURCES, Need.WRITE: Permission.WRITE_RESOURCES}
# The roles whose project rows limit them (services/tenancy/auth.py ``_allowed_projects``).
_PROJECT_LIMITED = frozenset({Role.MEMBER.value, Role.VIEWER.value})
_SCOPES = {
    Need.READ: frozenset({"read", "write", "admin"}),
    Need.WRITE: frozenset({"write", "admin"}),
}


@dataclass(frozen=True)
class KeyGrant:
    """One live API key, as far as access goes."""

    id: int
    user_id: int
    account_id: int
    restricted: bool
    project_id: int | None
    scope: str

    def acts_in(self, account_id: int, project_id: int, need: Need) -> bool:
        if self.scope not in _SCOPES[need]:
            return False
        if self.restricted and self.account_id != account_id:
            return False
        return self.project_id is None or self.project_id == project_id


@dataclass(frozen=True)
class Membership:
    role: str
    # None: every project of the account.
    projects: frozenset[int] | None

    def allows(self, project_id: int, need: Need) -> bool:
        try:
            role = Role(self.role)
        except ValueError:
            return False
        if not role_allows(role, _PERMISSION[need]):
            return False
        return self.projects is None or project_id in self.projects


@dataclass
class AccessIndex:
    """What a set of users hold now (memberships, project rows, live keys), read in
    one go so that many questions (every SSH key of every running cluster) cost a
    few reads."""

    memberships: dict[tuple[int, int], Membership] = field(default_factory=dict)
    keys: dict[int, list[KeyGrant]] = field(default_factory=lambda: defaultdict(list))
    admins: frozenset[int] = frozenset()

    @classmethod
    def load(cls, session: Session, user_ids: Iterable[int]) -> AccessIndex:
        users = sorted({u for u in user_ids if u is not None})
        index = cls()
        if not users:
            return index
        index.admins = frozenset(
            session.scalars(select(User.id).where(User.id.in_(users), User.is_admin.is_(True)))
        )
        members = list(session.execute(
            select(Member.id, Member.user_id, Member.account_id, Member.role)
            .where(Member.user_id.in_(users))
        ))  # fmt: skip
        limited = [m_id for m_id, _, _, role in members if role in _PROJECT_LIMITED]
        given: dict[int, set[int]] = defaultdict(set)
        if limited:
            for member_id, project_id in session.execute(
                select(ProjectMember.member_id, ProjectMember.project_id)
                .join(Project, Project.id == ProjectMember.project_id)
                .join(Member, Member.id == ProjectMember.member_id)
                .where(
                    ProjectMember.member_id.in_(limited),
                    Project.account_id == Member.account_id,
                )
            ):
                given[int(member_id)].add(int(project_id))
        for member_id, user_id, account_id, role in members:
            projects = given.get(int(member_id))
            index.memberships[(int(user_id), int(account_id))] = Membership(
                role=str(role),
                projects=frozenset(projects) if role in _PROJECT_LIMITED and projects else None,
            )
        for row in session.execute(
            select(
                ApiKey.id, ApiKey.user_id, ApiKey.account_id, ApiKey.restricted,
                ApiKey.project_id, ApiKey.scope,
            ).where(ApiKey.user_id.in_(users), ApiKey.revoked_at.is_(None))
        ):  # fmt: skip
            key_id, owner, key_account, restricted, key_project, scope = row
            index.keys[int(owner)].append(
                KeyGrant(
                    id=int(key_id),
                    user_id=int(owner),
                    account_id=int(key_account),
                    restricted=bool(restricted),
                    project_id=int(key_project) if key_project is not None else None,
                    scope=str(scope),
                )
            )
        return index

    def _operator_key(self, key: KeyGrant) -> bool:
        return key.user_id in self.admins and key.scope == "admin"

    def key_may(self, key_id: int, account_id: int, project_id: int, need: Need) -> bool:
        """Whether the live API key ``key_id`` (of a user loaded here) may ``need``
        the clusters of ``project_id`` in ``account_id``."""
        for keys in self.keys.values():
            for key in keys:
                if key.id == key_id:
                    return self._grant(key, account_id, project_id, need)
        return False  # revoked, or not a key of these users

    def user_may(
        self,
        user_id: int | None,
        account_id: int,
        project_id: int,
        need: Need,
        *,
        within_project: int | None = None,
    ) -> bool:
        """Whether ``user_id`` (loaded here) may ``need`` the clusters of
        ``project_id`` in ``account_id`` through at least one of their live keys.
        ``within_project``: the asker (an SSH key) is limited to that project."""
        if user_id is None:
            return False
        if within_project is not None and within_project != project_id:
            return False
        return any(self._grant(k, account_id, project_id, need) for k in self.keys.get(user_id, ()))

    def _grant(self, key: KeyGrant, account_id: int, project_id: int, need: Need) -> bool:
        if not key.acts_in(account_id, project_id, need):
            return False
        if self._operator_key(key):
            return True
        membership = self.memberships.get((key.user_id, account_id))
        return membership is not None and membership.allows(project_id, need)


def project_account(session: Session, project_id: int) -> int | None:
    return session.scalar(select(Project.account_id).where(Project.id == project_id))


def user_may_access(
    session: Session,
    user_id: int | None,
    project_id: int,
    need: Need,
    *,
    within_project: int | None = None,
) -> bool:
    """Whether ``user_id`` may ``need`` the clusters of ``project_id`` now (module
    docstring). False for an unknown project or user."""
    account_id = project_account(session, project_id)
    if account_id is None or user_id is None:
        return False
    index = AccessIndex.load(session, [user_id])
    return index.user_may(user_id, account_id, project_id, need, within_project=within_project)


def key_may_access(
    session: Session, api_key_id: int, account_id: int, project_id: int, need: Need
) -> bool:
    """Whether the API key ``api_key_id``, acting for ``account_id``, may ``need``
    the clusters of ``project_id`` now: it is unrevoked, its user still a member with
    a role (and projects) that allow it, or the operator. False for a project of
    another account."""
    if project_account(session, project_id) != account_id:
        return False
    user_id = session.scalar(select(ApiKey.user_id).where(ApiKey.id == api_key_id))
    if user_id is None:
        return False
    return AccessIndex.load(session, [user_id]).key_may(api_key_id, account_id, project_id, need)


def key_may_access_cluster(
    session: Session, api_key_id: int, account_id: int, cluster_id: str, need: Need
) -> bool:
    """:func:`key_may_access` for the project of cluster ``cluster_id`` (False when
    there is no such cluster)."""
    project_id = session.scalar(select(Cluster.project_id).where(Cluster.id == cluster_id))
    if project_id is None:
        return False
    return key_may_access(session, api_key_id, account_id, int(project_id), need)


def user_may_access_cluster(
    session: Session, user_id: int | None, cluster_id: str, need: Need
) -> bool:
    """:func:`user_may_access` for the project of cluster ``cluster_id`` (False when
    there is no such cluster): what a per-user session (a proxy cookie) asks."""
    project_id = session.scalar(select(Cluster.project_id).where(Cluster.id == cluster_id))
    if project_id is None:
        return False
    return user_may_access(session, user_id, int(project_id), need)


def key_still_may_access(ctx: Context, principal: Principal, cluster_id: str, need: Need) -> bool:
    """Whether ``principal``'s key may still ``need`` cluster ``cluster_id`` now (a
    stream opened with it re-asks while it is open: api/http/access_watch.py)."""
    with ctx.read() as session:
        return key_may_access_cluster(
            session, principal.key_id, principal.account_id, cluster_id, need
        )
