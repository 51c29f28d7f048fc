"""Reserved public IPs: addresses of the admin's pool (core/network/ippool.py) held by a
project until released; a training cluster may attach one (``attach_ip``).

Allocation hands out the lowest free address. Two concurrent allocations can never
hold the same address: the address column is unique, and an allocation that loses
that race retries with the next free address.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from gpuyard.core.errors import (
    Conflict,
    InsufficientCapacity,
    InvalidState,
    NotFound,
    ValidationFailed,
)
from gpuyard.core.network.ippool import parse_pool
from gpuyard.services.access.resource_util import iso, one_id
from gpuyard.services.billing.admission import refuse_closed_account
from gpuyard.services.context import Context
from gpuyard.services.owned_rows import owned_row
from gpuyard.services.tenancy.auth import Principal
from gpuyard.services.tenancy.projects import (
    ProjectRef,
    ResourceScope,
    project_of_ref,
    resolve_project,
    resource_scope,
)
from gpuyard.store.schema import ReservedIp

# Each retry follows a commit by another allocation, so the pool drains meanwhile;
# this bound only stops a livelock.
MAX_ATTEMPTS = 20


class ReservedIpNotFound(NotFound):
    code = "RESERVED_IP_NOT_FOUND"


def _used(session: Session) -> set[str]:
    return set(session.scalars(select(ReservedIp.address)))


def _lowest_free(session: Session, pool_text: str | None) -> str:
    pool = parse_pool(pool_text)
    if not pool:
        raise InsufficientCapacity(
            "no reserved IP pool is configured; an admin sets GPUYARD_RESERVED_IPS "
            "(e.g. 203.0.113.0/28)",
            {"pool_size": 0},
        )
    used = _used(session)
    for address in pool:
        if str(address) not in used:
            return str(address)
    raise InsufficientCapacity(
        f"the reserved IP pool is exhausted: all {len(pool)} addresses are reserved; "
        "release one or ask an admin to extend GPUYARD_RESERVED_IPS",
        {"pool_size": len(pool)},
    )


def allocate_reserved_ip(
    ctx: Context, principal: Principal, project_id: int | None, active_iam: int | None = None
) -> ReservedIp:
    """Reserve the lowest free pool address for a project of the acting account
    (one the caller may use). Raises ProjectNotFound / Forbidden, AccountSuspended
    (403) or BudgetExhausted (402) for an account that takes no new billed resources,
    InsufficientCapacity (no pool, or exhausted), or Conflict when it kept losing
    races (practically never). Needs the write permission (Forbidden)."""
    principal.require_write()
    for _ in range(MAX_ATTEMPTS):
        try:
            with ctx.transaction() as session:
                project = resolve_project(session, principal, project_id, active_iam)
                refuse_closed_account(session, project.account_id)
                row = ReservedIp(
                    address=_lowest_free(session, ctx.settings.reserved_ips),
                    account_id=project.account_id,
                    project_id=project.id,
                )
                session.add(row)
                session.flush()
                return row
        except IntegrityError:
            # Another transaction took that address first (the unique key); the next
            # attempt sees its row and picks another.
            continue
    raise Conflict("could not reserve an address: too many concurrent allocations; retry")


def _find(
    session: Session,
    scope: ResourceScope,
    reserved_ip_id: int,
    *,
    lock: bool = False,
) -> ReservedIp:
    """One reserved IP in ``scope`` (its account; the project it names, if any; a
    project the caller may use), by a path id; ``lock`` reads it fresh and locked
    until commit (PostgreSQL: an attach and a release of one address then apply one
    after the other). Raises ReservedIpNotFound, also for another account's or
    another project's."""
    return owned_row(
        session,
        ReservedIp,
        reserved_ip_id,
        scope.account_id,
        lambda: ReservedIpNotFound(
            f"reserved IP {reserved_ip_id} not found", {"reserved_ip_id": reserved_ip_id}
        ),
        visible=lambda row: scope.covers(row.project_id),
        lock=lock,
    )


def get_reserved_ip(
    session: Session,
    account_id: int,
    reserved_ip_id: object,
    field: str = "reserved_ip_id",
    *,
    project_id: int | None = None,
    for_update: bool = False,
) -> ReservedIp:
    """The reserved IP a request body names (of project ``project_id`` when given),
    inside the caller's transaction. Raises ValidationFailed(field, ...) for a
    missing, non-integer or unknown id, and in the same words for another account's
    or (``project_id``) another project's: the answer never tells that such an
    address exists."""
    if reserved_ip_id is None:
        raise ValidationFailed(field, "is required")
    wanted = one_id(reserved_ip_id, field, "reserved IP")
    where = f" in project {project_id}" if project_id is not None else ""
    return owned_row(
        session,
        ReservedIp,
        wanted,
        account_id,
        lambda: ValidationFailed(
            field, f"reserved IP {wanted} not found{where}", {"reserved_ip_id": wanted}
        ),
        visible=lambda row: project_id is None or row.project_id == project_id,
        lock=for_update,
    )


def list_reserved_ips(ctx: Context, principal: Principal, ref: ProjectRef) -> list[ReservedIp]:
    """The reserved IPs of ``ref``'s project (default: the acting account's default
    project), oldest first. Raises ValidationFailed, ProjectNotFound or Forbidden."""
    with ctx.read() as session:
        project = project_of_ref(session, principal, ref)
        return list(
            session.scalars(
                select(ReservedIp)
                .where(ReservedIp.project_id == project.id)
                .order_by(ReservedIp.id)
            )
        )


def show_reserved_ip(
    ctx: Context, principal: Principal, reserved_ip_id: int, ref: ProjectRef
) -> ReservedIp:
    """One reserved IP of the acting account (and of ``ref.project_id`` when given).
    Raises ReservedIpNotFound, ProjectNotFound / Forbidden."""
    with ctx.read() as session:
        return _find(session, resource_scope(session, principal, ref), reserved_ip_id)


def release_reserved_ip(
    ctx: Context, principal: Principal, reserved_ip_id: int, ref: ProjectRef
) -> None:
    """Return an address of the acting account (and of ``ref.project_id`` when given)
    to the pool. Needs the write permission. Raises Forbidden, ReservedIpNotFound,
    ProjectNotFound, or InvalidState while a training cluster has it attached."""
    principal.require_write()
    with ctx.transaction() as session:
        row = _find(session, resource_scope(session, principal, ref), reserved_ip_id, lock=True)
        if row.training_cluster_id is not None:
            raise InvalidState(
                f"reserved IP {row.address} is attached to training cluster "
                f"{row.training_cluster_id}; detach it first (action detach_ip)",
                {"reserved_ip_id": row.id, "training_cluster_id": row.training_cluster_id},
            )
        session.delete(row)
        session.flush()


def reserved_ip_view(row: ReservedIp) -> dict[str, Any]:
    """The API shape of a reserved IP."""
    return {
        "id": row.id,
        "address": row.address,
        "project_id": row.project_id,
        "status": "reserved" if row.training_cluster_id is None else "attached",
        "training_cluster_id": row.training_cluster_id,
        "created_at": iso(row.created_at),
    }
