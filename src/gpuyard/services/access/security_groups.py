"""Security groups of a project: named lists of inbound rules (core/network/secgroups.py)
that training clusters attach. Rules are stored in their canonical form.

The session-level functions run inside the caller's transaction (the training
service attaches groups in its own); the ``ctx`` use cases at the end open their own,
check the caller's permission, and re-sync the network edge of attached clusters
after a commit."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpuyard.core.errors import InvalidState, NotFound, ValidationFailed
from gpuyard.core.network.secgroups import parse_rules, rule_to_dict
from gpuyard.services.access.resource_util import id_list, in_id_range, iso
from gpuyard.services.context import Context
from gpuyard.services.owned_rows import owned_row
from gpuyard.services.tenancy.auth import Principal
from gpuyard.services.tenancy.projects import (
    ProjectRef,
    ResourceScope,
    project_of_ref,
    resource_scope,
)
from gpuyard.store.schema import SecurityGroup, TrainingCluster

MAX_RULES = 100
MAX_NAME_CHARS = 200
MAX_DESCRIPTION_CHARS = 2000


class SecurityGroupNotFound(NotFound):
    code = "SECURITY_GROUP_NOT_FOUND"


def _name(value: object) -> str:
    if not isinstance(value, str) or not value.strip() or len(value.strip()) > MAX_NAME_CHARS:
        raise ValidationFailed("name", f"must be a string of 1 to {MAX_NAME_CHARS} characters")
    return value.strip()


def _description(value: object) -> str:
    if value is None:
        return ""
    if not isinstance(value, str) or len(value) > MAX_DESCRIPTION_CHARS:
        raise ValidationFailed(
            "description", f"must be a string of at most {MAX_DESCRIPTION_CHARS} characters"
        )
    return value.strip()


def canonical_rules(raw: object) -> list[dict[str, str]]:
    """Validated rules in their stored form. Raises ValidationFailed("rules..."); a
    missing ``rules`` is an error (send ``[]`` for a group that denies everything)."""
    if raw is None:
        raise ValidationFailed("rules", "is required (a list of rules; [] denies everything)")
    rules = parse_rules(raw)
    if len(rules) > MAX_RULES:
        raise ValidationFailed("rules", f"at most {MAX_RULES} rules per group")
    return [rule_to_dict(r) for r in rules]


def create_group(
    session: Session,
    account_id: int,
    project_id: int,
    name: object,
    description: object,
    rules: object,
) -> SecurityGroup:
    """A new group of ``project_id``, inside the caller's transaction. Raises
    ValidationFailed naming the field."""
    row = SecurityGroup(
        account_id=account_id,
        project_id=project_id,
        name=_name(name),
        description=_description(description),
        rules=canonical_rules(rules),
    )
    session.add(row)
    session.flush()
    return row


def _replace(
    session: Session, row: SecurityGroup, name: object, description: object, rules: object
) -> SecurityGroup:
    """Replace a group's name, description (absent: empty) and rules. Clusters that
    attach it enforce the new rules from their next check."""
    clean = (_name(name), _description(description), canonical_rules(rules))
    row.name, row.description, row.rules = clean
    session.flush()
    return row


def _list(session: Session, project_id: int) -> list[SecurityGroup]:
    return list(
        session.scalars(
            select(SecurityGroup)
            .where(SecurityGroup.project_id == project_id)
            .order_by(SecurityGroup.id)
        )
    )


def _find(
    session: Session,
    scope: ResourceScope,
    group_id: int,
    *,
    lock: bool = False,
) -> SecurityGroup:
    """One group in ``scope`` (its account; the project it names, if any; a project
    the caller may use), by a path id; ``lock`` locks it (PostgreSQL). Raises
    SecurityGroupNotFound, also for another account's or project's."""
    return owned_row(
        session,
        SecurityGroup,
        group_id,
        scope.account_id,
        lambda: SecurityGroupNotFound(
            f"security group {group_id} not found", {"security_group_id": group_id}
        ),
        visible=lambda row: scope.covers(row.project_id),
        lock=lock,
    )


def attached_clusters(session: Session, group: SecurityGroup) -> list[int]:
    """Ids of the live training clusters that attach ``group``. Clusters only attach
    their own account's groups, so only that account's clusters are read; the JSON
    id list is searched here rather than in SQL, which differs per database."""
    rows = session.execute(
        select(TrainingCluster.id, TrainingCluster.security_group_ids).where(
            TrainingCluster.account_id == group.account_id,
            TrainingCluster.deleted_at.is_(None),
        )
    )
    return [cid for cid, ids in rows if group.id in (ids or [])]


def _delete(session: Session, scope: ResourceScope, group_id: int) -> SecurityGroup:
    """Delete a group. Raises SecurityGroupNotFound, or InvalidState while a training
    cluster attaches it. The row is locked first, as attaching locks it, so a delete
    and an attach of one group apply one after the other."""
    row = _find(session, scope, group_id, lock=True)
    clusters = attached_clusters(session, row)
    if clusters:
        raise InvalidState(
            f"security group {row.id} is attached to training cluster(s) "
            f"{', '.join(map(str, clusters))}; remove it from them first "
            "(action remove_security_group)",
            {"security_group_id": row.id, "training_cluster_ids": clusters},
        )
    session.delete(row)
    session.flush()
    return row


def groups_by_ids(
    session: Session, account_id: int, ids: object, field: str
) -> list[SecurityGroup]:
    """The groups named by ``ids`` (a non-empty JSON list of integer ids of
    ``account_id``'s groups), in the given order, duplicates dropped. Raises
    ValidationFailed(field, ...) for anything else; another account's group reads as
    unknown. The rows are locked (PostgreSQL) so none is deleted before the caller
    commits its attachment (see _delete)."""
    wanted = id_list(ids, field, "security group")
    rows = {
        r.id: r
        for r in session.scalars(
            select(SecurityGroup)
            .where(
                SecurityGroup.account_id == account_id,
                SecurityGroup.id.in_([i for i in wanted if in_id_range(i)]),
            )
            .order_by(SecurityGroup.id)  # one lock order for every request
            .with_for_update()
            .execution_options(populate_existing=True)
        )
    }
    missing = [i for i in wanted if i not in rows]
    if missing:
        raise ValidationFailed(
            field, f"security group {missing[0]} not found", {"missing_ids": missing}
        )
    return [rows[i] for i in wanted]


def group_view(row: SecurityGroup) -> dict[str, Any]:
    """The API shape of a security group."""
    return {
        "id": row.id,
        "name": row.name,
        "description": row.description,
        "project_id": row.project_id,
        "rules": list(row.rules),
        "created_at": iso(row.created_at),
    }


# ---------------------------------------------------------------- use cases


def list_project_groups(ctx: Context, principal: Principal, ref: ProjectRef) -> list[SecurityGroup]:
    """The groups of ``ref``'s project (default: the acting account's default
    project), oldest first. Raises ProjectNotFound / Forbidden."""
    with ctx.read() as session:
        return _list(session, project_of_ref(session, principal, ref).id)


def create_project_group(
    ctx: Context,
    principal: Principal,
    ref: ProjectRef,
    name: object,
    description: object,
    rules: object,
) -> SecurityGroup:
    """A new group of ``ref``'s project. Needs the write permission. Raises
    ProjectNotFound / Forbidden, or ValidationFailed naming the field."""
    principal.require_write()
    with ctx.transaction() as session:
        project = project_of_ref(session, principal, ref)
        return create_group(session, project.account_id, project.id, name, description, rules)


def show_group(ctx: Context, principal: Principal, group_id: int, ref: ProjectRef) -> SecurityGroup:
    """One group of the acting account (and of ``ref.project_id`` when given).
    Raises SecurityGroupNotFound, ProjectNotFound / Forbidden."""
    with ctx.read() as session:
        scope = resource_scope(session, principal, ref)
        return _find(session, scope, group_id)


def update_group(
    ctx: Context,
    principal: Principal,
    group_id: int,
    ref: ProjectRef,
    name: object,
    description: object,
    rules: object,
) -> SecurityGroup:
    """Replace a group's name, description (absent: empty) and rules, then re-sync
    the network edge of every live training cluster that attaches it (after the
    commit: the edge is a runtime call), so they enforce the new rules at once.
    Needs the write permission. Raises as show_group, Forbidden, or ValidationFailed
    naming the field."""
    principal.require_write()
    with ctx.transaction() as session:
        scope = resource_scope(session, principal, ref)
        row = _find(session, scope, group_id)
        _replace(session, row, name, description, rules)
        attached = attached_clusters(session, row)
    for cluster_id in attached:
        ctx.training_edge(cluster_id)
    return row


def remove_group(ctx: Context, principal: Principal, group_id: int, ref: ProjectRef) -> None:
    """Delete a group (see _delete: 409 while a training cluster attaches it).
    Needs the write permission. Raises as show_group, Forbidden, or InvalidState."""
    principal.require_write()
    with ctx.transaction() as session:
        scope = resource_scope(session, principal, ref)
        _delete(session, scope, group_id)
