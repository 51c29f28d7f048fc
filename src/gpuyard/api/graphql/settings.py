"""The GraphQL surface's knobs, taken from :class:`gpuyard.settings.Settings`.

The values are ``Settings``' ``graphql_*`` fields (``GPUYARD_GRAPHQL_*`` variables);
this view only names them as the surface uses them, so the limits and the executor
depend on nothing else of the settings.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuyard.settings import Settings


@dataclass(frozen=True, slots=True)
class GraphQLSettings:
    """Limits against abusive documents and whether introspection is answered.

    The defaults (those of ``Settings``) admit graphql-core's standard introspection query
    (depth 15) and every query RunPod's SDK and the seed send, with room to spare.
    """

    introspection: bool = True
    max_depth: int = 15
    max_aliases: int = 30
    max_tokens: int = 2_000
    max_batch: int = 10
    max_query_length: int = 32_768
    # Parsed and validated documents kept, by query text (LRU).
    document_cache_size: int = 512
    # A container's runtime stats (``runtime { container }``) are read from the engine at
    # most once per this many seconds, however many clients poll; a failed read is
    # retried after runtime_stats_error_ttl_s (at most the former).
    runtime_stats_ttl_s: float = 3.0
    runtime_stats_error_ttl_s: float = 0.5

    @classmethod
    def of(cls, settings: Settings) -> GraphQLSettings:
        """The GraphQL knobs of ``settings`` (already validated there)."""
        return cls(
            introspection=settings.graphql_introspection,
            max_depth=settings.graphql_max_depth,
            max_aliases=settings.graphql_max_aliases,
            max_tokens=settings.graphql_max_tokens,
            max_batch=settings.graphql_max_batch,
            max_query_length=settings.graphql_max_query_length,
            document_cache_size=settings.graphql_document_cache_size,
            runtime_stats_ttl_s=settings.graphql_runtime_stats_ttl_s,
            runtime_stats_error_ttl_s=settings.graphql_runtime_stats_error_ttl_s,
        )
