"""What each GraphQL field needs of the acting membership's role (core/roles.py): the
GraphQL half of api/http/permissions.py.

- queries read resources (READ_RESOURCES): ``cluster``, ``pod``, ``myself { clusters
  pods networkVolumes podTemplates endpoints }``;
- the spend of the account (``myself { currentSpendPerHr }``) is billing
  (READ_BILLING);
- the caller itself (``myself { id pubKey }``) and the GPU catalog (``gpuTypes``) need
  only a valid key, as the REST catalog does;
- mutations change resources (WRITE_RESOURCES), ``saveTemplate``,
  ``deleteTemplate``, ``saveEndpoint`` and ``deleteEndpoint`` too, and ``updateUserSettings``: its
  ``pubKey`` replaces the account's SSH keys, which log into every cluster of the
  account (as ``POST /v1/ssh-keys``).

A key restricted to a project has no account-level permission whatever its role
(``Principal.allows``, core/roles.py ACCOUNT_LEVEL), so ``currentSpendPerHr`` is refused
to it here as the bills are in REST.

A refused field answers null with a FORBIDDEN error in ``errors[]``
(``extensions.code``, api/graphql/errors.py); the other fields of the operation stand.
The check runs first in each resolver, before anything is read or claimed.
"""

from __future__ import annotations

from gpuyard.api.graphql.context import GqlContext
from gpuyard.core.roles import Permission


def require(gctx: GqlContext, permission: Permission) -> None:
    """Raises Forbidden unless the caller's role and key scope allow ``permission``."""
    gctx.principal.require_permission(permission)
