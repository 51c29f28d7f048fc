"""The GraphQL API of seed 001 and RunPod's names, at ``/graphql`` (Strawberry).

Modules: ``settings`` (the ``graphql_*`` fields of ``Settings``), ``context``
(per-request caches and the caller), ``inputs`` / ``types`` (the schema's shapes),
``queries`` / ``mutations`` (root fields over the cluster use cases), ``spot``
(adapter to the spot market), ``errors`` (``extensions.code``, masking), ``limits``
(depth, aliases, tokens, document cache), ``endpoint`` (HTTP, auth, batching).
"""

from gpuyard.api.graphql.endpoint import build_router
from gpuyard.api.graphql.settings import GraphQLSettings

__all__ = ["GraphQLSettings", "build_router"]
