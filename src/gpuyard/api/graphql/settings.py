"""Settings of the GraphQL surface, read from ``GPUYARD_GRAPHQL_*`` variables.

Kept apart from :class:`gpuyard.settings.Settings` so the surface owns its knobs; like
it, nothing is read at import time (:func:`gpuyard.api.graphql.build_router` builds one).
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class GraphQLSettings(BaseSettings):
    """Limits against abusive documents and whether introspection is answered.

    The defaults admit graphql-core's standard introspection query (depth 15) and every query
    RunPod's SDK and the seed send, with room to spare.
    """

    model_config = SettingsConfigDict(env_prefix="GPUYARD_GRAPHQL_", extra="ignore")

    introspection: bool = True
    max_depth: int = Field(default=15, ge=1, le=100)
    max_aliases: int = Field(default=30, ge=0, le=10_000)
    max_tokens: int = Field(default=2_000, ge=10, le=1_000_000)
    max_batch: int = Field(default=10, ge=1, le=1_000)
    max_query_length: int = Field(default=32_768, ge=100, le=10_000_000)
    # Parsed and validated documents kept, by query text (LRU).
    document_cache_size: int = Field(default=512, ge=0, le=100_000)
    # A container's runtime stats (``runtime { container }``) are read from the engine at
    # most once per this many seconds, however many clients poll; a failed read is
    # retried after runtime_stats_error_ttl_s (at most the former).
    runtime_stats_ttl_s: float = Field(default=3.0, ge=0, le=60)
    runtime_stats_error_ttl_s: float = Field(default=0.5, ge=0, le=60)
