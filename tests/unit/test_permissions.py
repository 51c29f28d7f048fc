"""The route → permission table (api/http/permissions.py) and what each role may do
through it (core/roles.py): the table's classes, read by method and path template."""

from __future__ import annotations

import pytest

from gpuyard.api.http.permissions import route_permission
from gpuyard.core.roles import ROLE_PERMISSIONS, Permission, Role

P = Permission


@pytest.mark.parametrize(
    ("method", "path", "needed"),
    [
        ("GET", "/v1/clusters", P.READ_RESOURCES),
        ("HEAD", "/v1/clusters/{cluster_id}", P.READ_RESOURCES),
        ("POST", "/v1/clusters", P.WRITE_RESOURCES),
        ("DELETE", "/v1/clusters/{cluster_id}", P.WRITE_RESOURCES),
        ("GET", "/v1/clusters/{cluster_id}/logs", P.READ_RESOURCES),
        ("GET", "/v1/networkvolumes", P.READ_RESOURCES),
        ("PATCH", "/v1/networkvolumes/{network_volume_id}", P.WRITE_RESOURCES),
        ("POST", "/v1/clusters/{cluster_id}/snapshots", P.WRITE_RESOURCES),
        ("GET", "/distributed_jobs_v2/cluster/", P.READ_RESOURCES),
        ("PUT", "/distributed_jobs_v2/cluster/{Cluster_Id}/", P.WRITE_RESOURCES),
        # A GET that hands out a way into a cluster needs what a change needs.
        ("GET", "/v1/clusters/{cluster_id}/ports/{port}/open", P.WRITE_RESOURCES),
        ("GET", "/v1/clusters/{cluster_id}/terminal", P.WRITE_RESOURCES),
        ("GET", "/v1/billing", P.READ_BILLING),
        ("POST", "/v1/billing", P.MANAGE_BUDGET),
        # SSH keys are the account's (they log into its clusters): resources.
        ("GET", "/v1/ssh-keys", P.READ_RESOURCES),
        ("POST", "/v1/ssh-keys", P.WRITE_RESOURCES),
        ("GET", "/v1/api-keys", P.OWN_KEYS),
        ("DELETE", "/v1/api-keys/{key_id}", P.OWN_KEYS),
        ("POST", "/v1/projects", P.MANAGE_PROJECTS),
        ("PATCH", "/v1/projects/{project_id}", P.MANAGE_PROJECTS),
        ("DELETE", "/v1/projects/{project_id}/members/{member_id}", P.MANAGE_PROJECTS),
        # Every member sees the account's projects.
        ("GET", "/v1/projects", None),
        # Routes that check on their own, need any key, or none.
        ("GET", "/v1/gpu-types", None),
        ("POST", "/v1/hosts", None),
        ("DELETE", "/v1/orphans/{orphan_id}", None),
        ("POST", "/v1/accounts", None),
        ("PATCH", "/v1/accounts/{account_id}/budget", None),
        ("POST", "/v1/invitations/{token}/accept", None),
        ("GET", "/v1/audit-events", None),
        ("GET", "/v1/me", None),
        ("GET", "/healthz", None),
        ("POST", "/graphql", None),
        ("GET", "/metrics", None),
    ],
)
def test_route_permission(method: str, path: str, needed: Permission | None) -> None:
    assert route_permission(method, path) == needed


def test_prefixes_match_whole_segments() -> None:
    # "/v1/meta" is not under "/v1/me"; "/v1/billing-x" is not billing.
    assert route_permission("GET", "/v1/meta") == P.READ_RESOURCES
    assert route_permission("POST", "/v1/billing-x") == P.WRITE_RESOURCES
    assert route_permission("GET", "/v1/accountsx") == P.READ_RESOURCES


# The issue's matrix: owner, admin (members, keys, quotas of projects), member
# (clusters, snapshots, keys of their own), billing (billing and budgets only),
# viewer (read).
MATRIX: dict[Role, set[Permission]] = {
    Role.OWNER: set(Permission),
    Role.ADMIN: set(Permission) - {P.MANAGE_ACCOUNT},
    Role.MEMBER: {P.READ_RESOURCES, P.WRITE_RESOURCES, P.OWN_KEYS},
    Role.BILLING: {P.READ_BILLING, P.MANAGE_BUDGET, P.OWN_KEYS},
    Role.VIEWER: {P.READ_RESOURCES, P.OWN_KEYS},
}


def test_roles_grant_the_issue_matrix() -> None:
    assert {r: set(ps) for r, ps in ROLE_PERMISSIONS.items()} == MATRIX
