"""What each REST route needs of the acting membership's role (core/roles.py).

Checked once per request where the principal is resolved (api/state.py), from the
matched route's path template and the method, so no route can forget it. Routes with
checks of their own (the operator's: hosts, images, orphans, accounts) and the
catalog (GPU types, price quotes, locations, plans: anybody with a key) need nothing
here. Whether the key allows a permission — its scope, and a restriction to a project,
which withholds every account-level one — is the principal's (services/tenancy/auth.py
``Principal.allows``), the same for every surface.
"""

from __future__ import annotations

from gpuyard.core.roles import Permission

_READ = frozenset({"GET", "HEAD", "OPTIONS"})

# Path prefixes whose routes check on their own, or need only a valid key.
_OWN_CHECKS = (
    "/v1/hosts",
    "/v1/images",
    "/v1/orphans",
    "/v1/gpu-types",
    "/v1/prices",
    "/v1/locations",
    "/v1/plans",
    "/v1/accounts",
    "/v1/invitations",
    "/v1/audit-events",
    "/v1/me",
    # RunPod v2's catalog (GPU types, data centers): anybody with a key, as /v1's.
    "/runpod/v2/catalog",
)
# Routes that need no key at all, or resolve and check the principal themselves
# (GraphQL per field: api/graphql/access.py; the metrics scrape: the operator).
_NOT_HERE = ("/healthz", "/graphql", "/metrics")
# Reads that hand out a way to change or run code in a cluster: the one-time link to a
# private port (often a notebook) and the web terminal need what a change needs.
_WRITES_BY_GET = frozenset(
    {
        "/v1/clusters/{cluster_id}/ports/{port}/open",
        "/v1/clusters/{cluster_id}/terminal",
    }
)
_BILLING = ("/v1/billing",)
# The caller's own API keys. SSH keys are not here: they are the account's, and log
# into every cluster of it (the SSH gateway, the clusters' PUBLIC_KEY), so reading them
# is reading resources and changing them a change to the clusters' access.
_OWN_KEYS = ("/v1/api-keys",)
_PROJECTS = ("/v1/projects",)


def _under(path: str, prefixes: tuple[str, ...]) -> bool:
    return any(path == p or path.startswith(p + "/") for p in prefixes)


def route_permission(method: str, path: str) -> Permission | None:
    """The permission a request of ``method`` on the route ``path`` (its template,
    e.g. ``/v1/clusters/{cluster_id}``) needs; None when the route decides itself."""
    reading = method.upper() in _READ
    if _under(path, _OWN_CHECKS) or _under(path, _NOT_HERE):
        return None
    if path in _WRITES_BY_GET:
        return Permission.WRITE_RESOURCES
    if _under(path, _BILLING):
        return Permission.READ_BILLING if reading else Permission.MANAGE_BUDGET
    if _under(path, _OWN_KEYS):
        return Permission.OWN_KEYS
    if _under(path, _PROJECTS):
        # Every member may see the account's projects; only admins change them.
        return None if reading else Permission.MANAGE_PROJECTS
    return Permission.READ_RESOURCES if reading else Permission.WRITE_RESOURCES
